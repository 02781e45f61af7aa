package admin

import (
	"bytes"
	"fmt"
	"os"

	"golang.org/x/net/http/httpguts"
)

// ReadToken returns the bearer token in the file at path, without the
// white space around it that editors and `kubectl create secret` leave.
// A token that no request could carry (two lines, a control byte) is an
// error, which does not show the token.
func ReadToken(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	b = bytes.TrimSpace(b)
	if err == nil && !httpguts.ValidHeaderFieldValue(string(b)) {
		return nil, fmt.Errorf("%s: the token holds a line break or another control byte, which an Authorization header cannot carry", path)
	}
	return b, err
}
