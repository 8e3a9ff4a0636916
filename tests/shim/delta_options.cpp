// delta-options: prints DELTA's options table as Markdown, or rewrites the marked table in
// docs/options.md and README.md so they follow shim/options.cpp (options-test checks them).
//   delta-options                    print the table
//   delta-options --update FILE...   replace the table between the markers in each FILE
//   delta-options --check FILE...    exit 1 when a FILE's marked table differs
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>

#include "shim/options.h"
#include "tests/shim/options_doc.h"

int main(int argc, char** argv) {
  using namespace delta::shim;
  const std::string table = optionsMarkdownTable();
  if (argc == 1) {
    std::fputs(table.c_str(), stdout);
    return 0;
  }
  std::string_view command = argv[1];
  if ((command != "--update" && command != "--check") || argc < 3) {
    std::fprintf(stderr, "usage: %s [--update|--check FILE...]\n", argv[0]);
    return 2;
  }
  int status = 0;
  for (int i = 2; i < argc; ++i) {
    auto text = doc::readFile(argv[i]);
    auto updated = text ? doc::withTable(*text, table) : std::nullopt;
    if (!updated) {
      std::fprintf(stderr, "%s: cannot read %s or it lacks the lines %s / %s\n", argv[0], argv[i],
                   std::string(kTableBeginMarker).c_str(), std::string(kTableEndMarker).c_str());
      status = 1;
      continue;
    }
    if (command == "--check") {
      if (doc::markedTable(*text) != table) {
        std::fprintf(stderr, "%s: the options table in %s is out of date\n", argv[0], argv[i]);
        status = 1;
      }
    } else if (*updated != *text) {
      std::ofstream out(argv[i], std::ios::binary | std::ios::trunc);
      out << *updated;
      if (!out.flush()) {
        std::fprintf(stderr, "%s: cannot write %s\n", argv[0], argv[i]);
        status = 1;
      }
    }
  }
  return status;
}
