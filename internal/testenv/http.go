package testenv

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// Client is an HTTP client for the tests that reach the admin endpoint,
// the metrics listener or a peer: it keeps its connections open between
// requests and counts the connections it dialled, so that a test can tell
// that a listener stayed open through a reload.
type Client struct {
	tb    testing.TB
	http  *http.Client
	dials atomic.Int32
}

// NewClient returns a Client whose failures fail tb.
func NewClient(tb testing.TB) *Client {
	c := &Client{tb: tb}
	c.http = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
		c.dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, address)
	}}}
	tb.Cleanup(c.http.CloseIdleConnections)
	return c
}

// Do sends a request with the headers of header (and Host, when header
// has it, as the request's host) and returns the status and the body.
func (c *Client) Do(method, url string, header map[string]string) (int, []byte) {
	c.tb.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		c.tb.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		c.tb.Fatal(err)
	}
	return resp.StatusCode, body
}

// Dials returns the connections c has dialled.
func (c *Client) Dials() int { return int(c.dials.Load()) }

// Get fetches url once and returns the status and the body.
func Get(tb testing.TB, url string) (int, []byte) {
	tb.Helper()
	return NewClient(tb).Do(http.MethodGet, url, nil)
}

// ServeBytes starts an HTTP server on the loopback that answers every
// request with body, and returns its URL; it stops when the test ends.
func ServeBytes(tb testing.TB, body []byte) string {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(body) }))
	tb.Cleanup(s.Close)
	return s.URL
}
