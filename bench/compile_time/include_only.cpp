// Compile-time benchmark (scripts/bench compile_time): what including the whole library costs a file.
#include <dl/dl.hpp>
