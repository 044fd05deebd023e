// Compiled only to build the tests' shared precompiled header (tests/CMakeLists.txt, dl_test_pch).
