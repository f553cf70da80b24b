// The CLI's error and output lines (cli/command.h): in siphon_cli_lib so
// that the helpers that print them (cli/long_running.h) are tested without
// the binary.
#include <cstdio>
#include <string>
#include <string_view>

#include "cli/command.h"
#include "cli/exit_codes.h"

namespace siphon::cli {

void printError(std::string_view message) {
  std::string line = "siphon: ";
  line.append(message);
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stderr);
}

int printOutput(const std::string& out) {
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0) {
    printError("cannot write the output");
    return kExitError;
  }
  return kExitOk;
}

int reportFailure(std::string_view what, const absl::Status& status) {
  Failure f = requestFailure(what, status);
  printError(f.message);
  return f.exit_code;
}

}  // namespace siphon::cli
