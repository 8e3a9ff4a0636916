// Flat JSON-lines parser: see json_line.h.
#include "policy/json_line.h"

#include <cctype>

namespace delta::policy {

namespace {

class Cursor {
 public:
  explicit Cursor(std::string_view s) : s_(s) {}
  void skipSpace() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    skipSpace();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  char peek() {
    skipSpace();
    return i_ < s_.size() ? s_[i_] : '\0';
  }
  bool atEnd() {
    skipSpace();
    return i_ >= s_.size();
  }
  std::string fail(const std::string& what) const {
    return what + " at column " + std::to_string(i_ + 1);
  }
  bool string(std::string& out, std::string& err) {
    out.clear();
    if (!eat('"')) {
      err = fail("expected '\"'");
      return false;
    }
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) {
        err = fail("control character in string");
        return false;
      }
      if (c == '\\') {
        if (i_ >= s_.size()) break;
        const char e = s_[i_++];
        switch (e) {
          case '"': case '\\': case '/': c = e; break;
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case 'b': c = '\b'; break;
          case 'f': c = '\f'; break;
          default:
            err = fail("unsupported escape");  // \u is not used by the logs we read
            return false;
        }
      }
      out.push_back(c);
    }
    if (i_ >= s_.size()) {
      err = fail("unterminated string");
      return false;
    }
    ++i_;
    return true;
  }
  bool integer(std::int64_t& out, std::string& err) {
    skipSpace();
    const bool neg = i_ < s_.size() && s_[i_] == '-';
    if (neg) ++i_;
    const std::size_t begin = i_;
    std::uint64_t v = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      if (v > (UINT64_C(1) << 62)) {
        err = fail("integer too large");
        return false;
      }
      v = v * 10 + static_cast<std::uint64_t>(s_[i_++] - '0');
    }
    if (i_ == begin) {
      err = fail("expected a string, an integer or an array");
      return false;
    }
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) {
      err = fail("expected an integer");
      return false;
    }
    out = neg ? -static_cast<std::int64_t>(v) : static_cast<std::int64_t>(v);
    return true;
  }

 private:
  std::string_view s_;
  std::size_t i_ = 0;
};

}  // namespace

std::string JsonLine::parse(std::string_view line) {
  fields_.clear();
  Cursor c(line);
  std::string err;
  if (!c.eat('{')) return c.fail("expected '{'");
  if (!c.eat('}')) {
    do {
      Field f;
      if (!c.string(f.key, err)) return err;
      if (!c.eat(':')) return c.fail("expected ':'");
      const char p = c.peek();
      if (p == '"') {
        f.value.kind = JsonValue::Kind::kString;
        if (!c.string(f.value.str, err)) return err;
      } else if (p == '[') {
        c.eat('[');
        f.value.kind = JsonValue::Kind::kArray;
        if (!c.eat(']')) {
          do {
            if (c.peek() == '"') {
              if (!f.value.nums.empty()) return c.fail("mixed array");
              if (!c.string(f.value.strs.emplace_back(), err)) return err;
            } else {
              if (!f.value.strs.empty()) return c.fail("mixed array");
              if (!c.integer(f.value.nums.emplace_back(), err)) return err;
            }
          } while (c.eat(','));
          if (!c.eat(']')) return c.fail("expected ',' or ']'");
        }
      } else {
        f.value.kind = JsonValue::Kind::kInt;
        if (!c.integer(f.value.num, err)) return err;
      }
      fields_.push_back(std::move(f));
    } while (c.eat(','));
    if (!c.eat('}')) return c.fail("expected ',' or '}'");
  }
  if (!c.atEnd()) return c.fail("trailing text after the object");
  return {};
}

const JsonValue* JsonLine::find(std::string_view key) const {
  for (const Field& f : fields_) {
    if (f.key == key) return &f.value;
  }
  return nullptr;
}

}  // namespace delta::policy
