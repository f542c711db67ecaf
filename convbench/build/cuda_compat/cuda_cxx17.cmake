# Passed to DaCe's CMake run as CMAKE_USER_MAKE_RULES_OVERRIDE_CUDA.
# DaCe 1.0.2 sets CMAKE_CUDA_STANDARD 14, but CUDA 13's CCCL headers require
# C++17.  Mapping the "C++14" compile option to -std=c++17 lifts every CUDA
# translation unit to C++17 without patching DaCe.
set(CMAKE_CUDA14_STANDARD_COMPILE_OPTION "-std=c++17")
set(CMAKE_CUDA14_EXTENSION_COMPILE_OPTION "-std=c++17")
