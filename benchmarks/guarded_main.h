#pragma once
// A benchmark's main, with its errors reported as a message: a c10::Error prints
// what_without_backtrace() (torch's frames of addresses only with TP_BACKTRACE=1),
// any other exception its what(); the exit status is 2. Without it an escaping error
// ends in std::terminate, which prints the whole backtrace.

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>

namespace tp::bench {

template <typename Body>
int guarded_main(const char* program, int argc, char** argv, Body body) {
  try {
    return body(argc, argv);
  } catch (const c10::Error& e) {
    const char* bt = std::getenv("TP_BACKTRACE");
    std::cerr << program << ": " << (bt != nullptr && std::strcmp(bt, "1") == 0 ? e.what() : e.what_without_backtrace())
              << "\n";
  } catch (const std::exception& e) {
    std::cerr << program << ": " << e.what() << "\n";
  }
  return 2;
}

}  // namespace tp::bench
