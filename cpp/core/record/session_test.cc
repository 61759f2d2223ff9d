// session tests: see session_test.cc (end to end through the store)
