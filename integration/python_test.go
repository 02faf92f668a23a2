package integration

import "os"

// testPython is $SPOTAGENT_TEST_PYTHON, else /usr/bin/python3.
func testPython() string {
	if p := os.Getenv("SPOTAGENT_TEST_PYTHON"); p != "" {
		return p
	}
	return "/usr/bin/python3"
}
