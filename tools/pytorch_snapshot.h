// `delta-trace export --pytorch-snapshot FILE -o OUT.pickle`: a shim trace as the pickle that
// `torch.cuda.memory._dump_snapshot` writes, for PyTorch's memory viewer (pytorch.org/memory_viz).
// The tools link no Python: PickleWriter emits the few opcodes such a snapshot needs itself.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace delta::tools {

// Pickle protocol 2 for dicts, lists, tuples, ints, strings, bools and None, appended to a
// byte string the caller drains (take()) whenever it likes: the containers' items go out in
// batches of kBatch (as Python's own pickler does) so that a list of millions of trace entries
// never sits on the unpickler's stack at once, and nothing here holds more than one batch.
// No memo: a snapshot has no shared or recursive objects. Calls must nest properly (a dict's
// key() before each of its values); the writer does not check.
class PickleWriter {
 public:
  static constexpr std::size_t kBatch = 1000;

  void begin();  // PROTO 2
  void end();    // STOP

  void none();
  void boolean(bool v);
  void integer(std::int64_t v);
  void unsignedInteger(std::uint64_t v);
  void string(std::string_view utf8);

  void beginDict();
  void key(std::string_view k);  // then exactly one value
  void endDict();
  void beginList();
  void endList();
  void beginTuple();
  void endTuple();

  const std::string& bytes() const { return out_; }
  std::string take() { return std::exchange(out_, {}); }

 private:
  enum class Kind : std::uint8_t { kDict, kList, kTuple };
  struct Frame {
    Kind kind;
    std::size_t pending = 0;  // items since the open MARK (0: none open)
  };
  void beforeValue();

  std::string out_;
  std::vector<Frame> frames_;
};

// Reads the trace at `input`, writes the snapshot to `output` ('-': standard output). Exit
// status as the other export formats: 0 ok (a file cut short: exported up to its last whole
// record, with a warning), 1 unreadable or corrupt input or a failed write.
int exportPytorchSnapshot(const std::string& input, const std::string& output);

}  // namespace delta::tools
