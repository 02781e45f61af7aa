package admin

import (
	"bytes"
	"os"
)

// ReadToken returns the bearer token in the file at path, without the
// white space around it that editors and `kubectl create secret` leave.
func ReadToken(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	return bytes.TrimSpace(b), err
}
