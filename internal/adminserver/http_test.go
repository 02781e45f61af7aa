package adminserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/miekg/dns"
	"strings"
	"testing"
)

func TestAdminName(t *testing.T) {
	for _, bad := range []string{"", " www.example.org", "a..b", strings.Repeat("a", 64) + ".org", strings.Repeat("abcdefghi.", 26)} {
		if _, err := adminName(bad); err == nil {
			t.Errorf("adminName(%q) took it", bad)
		}
	}
	for _, s := range []string{"a", "3.typ0.\\046x.", "."} {
		if _, err := adminName(s); err != nil {
			t.Errorf("adminName(%q): %v", s, err)
		}
	}
	// An internationalized name reaches its entries, stored under its
	// A-labels as clients ask for it, in either form.
	want, _ := adminName("xn--bcher-kva.example")
	for _, s := range []string{"bücher.example", "Bücher.Example.", "XN--BCHER-KVA.example"} {
		if got, err := adminName(s); err != nil || !bytes.Equal(got, want) {
			t.Errorf("adminName(%q) = %q, %v; want %q", s, got, err, want)
		}
	}
	// Only the labels that are not ASCII are IDNA's: an underscore or a
	// wildcard label beside one is a DNS name's, and stays.
	for _, tc := range []struct{ in, want string }{
		{"_sip._tcp.bücher.example", "_sip._tcp.xn--bcher-kva.example."},
		{"*.Bücher.example.", "*.xn--bcher-kva.example."},
		{"_25._tcp.mail.bücher.example", "_25._tcp.mail.xn--bcher-kva.example."},
		{"a\\.b.bücher.example", "a\\.b.xn--bcher-kva.example."},
	} {
		want, _ := adminName(tc.want)
		if got, err := adminName(tc.in); err != nil || !bytes.Equal(got, want) {
			t.Errorf("adminName(%q) = %q, %v; want %q", tc.in, got, err, want)
		}
	}
	if _, err := adminName("a\u200d\u0301.example"); err == nil {
		t.Errorf("adminName took a name IDNA refuses")
	}
	// A backslash that ends a name escapes nothing: the name is refused,
	// not cut to the labels before it (bücher\ to the root, which
	// flush_zone would take for everything).
	for _, bad := range []string{"bücher\\", "x.bücher\\", "bücher.x\\", "\\"} {
		if got, err := adminName(bad); err == nil {
			t.Errorf("adminName(%q) = %q, want an error", bad, got)
		}
	}
	// A name longer than any name's presentation form is refused before
	// IDNA, whose encoding of a long label is quadratic, and not quoted
	// back whole.
	for _, huge := range []string{strings.Repeat("a", 1<<20), strings.Repeat("\u4e00\u4e01\u4e02", 1<<10)} {
		if _, err := adminName(huge); err == nil || len(err.Error()) > 200 {
			t.Errorf("adminName of %d bytes: an error of %d bytes, want one of at most 200", len(huge), len(fmt.Sprint(err)))
		}
	}
	// A decimal escape above 255 is refused, naming it: miekg/dns takes
	// it modulo 256 (a\256 for a\000), which would flush another name.
	for _, bad := range []string{`a\256`, `a\999.example`, `\300.example.`, `x.a\256b.bücher.example`, `a\\\256`} {
		if got, err := adminName(bad); err == nil || !strings.Contains(err.Error(), "above \\255") {
			t.Errorf("adminName(%q) = %q, %v; want an error saying the escape is above \\255", bad, got, err)
		}
	}
	for _, s := range []string{`a\255`, `a\\256`, `a\0256`, `a\25`} {
		if _, err := adminName(s); err != nil {
			t.Errorf("adminName(%q): %v", s, err)
		}
	}
	if _, err := adminName(strings.Repeat("\\255", 63) + ".example"); err != nil {
		t.Errorf("a label of 63 bytes, each escaped: %v", err)
	}
	for s, want := range map[string]uint16{"a": dns.TypeA, "aaaa": dns.TypeAAAA, "TYPE65280": 65280, "https": dns.TypeHTTPS} {
		if got, ok := parseType(s); !ok || got != want {
			t.Errorf("parseType(%q) = %d, %t", s, got, ok)
		}
	}
	for _, bad := range []string{"", "AA", "TYPE70000", "TYPE-1", "1"} {
		if _, ok := parseType(bad); ok {
			t.Errorf("parseType(%q) took it", bad)
		}
	}
}

// recordingCache is a Cache that records the flushes it is asked for.
type recordingCache struct{ flushes []flush.Flush }

func (c *recordingCache) Flush(f flush.Flush) (admin.Counts, error) {
	c.flushes = append(c.flushes, f)
	return admin.Counts{}, nil
}
func (c *recordingCache) Entries([]byte, []uint16, func(entry.Entry)) {}
func (c *recordingCache) Walk(func(entry.Entry), func() error) error  { return nil }
func (c *recordingCache) Now() int64                                  { return 0 }
func (c *recordingCache) Grace() int64                                { return 0 }
func (c *recordingCache) Stats() admin.Stats                          { return admin.Stats{} }
func (c *recordingCache) Snapshot(io.Writer) (int, error)             { return 0, nil }

// TestOperationsNotFlushes: an operation the API lists that the server
// does not serve answers 404 and flushes nothing, as an operation that
// the API does not list; the flushes reach the cache as the flush they name.
func TestOperationsNotFlushes(t *testing.T) {
	const readOnly = "peek"
	admin.Specs[readOnly] = admin.Spec{Method: http.MethodGet}
	defer delete(admin.Specs, readOnly)
	c := &recordingCache{}
	s := &adminServer{blocks: []*adminBlock{{inst: &adminInstance{cfg: adminConfig{addr: "127.0.0.1:1", insecure: true}}, c: c, info: admin.Block{Name: "b"}}}}
	do := func(method, target string) int {
		r := httptest.NewRequest(method, target, nil)
		r.Host = "127.0.0.1"
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w.Code
	}
	for _, target := range []string{"/v1/" + readOnly, "/v1/flush_everything", "/v1/", "/flush_all"} {
		if code := do(http.MethodGet, target); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", target, code)
		}
		if code := do(http.MethodPost, target); code == http.StatusOK {
			t.Errorf("POST %s: 200", target)
		}
	}
	if len(c.flushes) != 0 {
		t.Fatalf("requests for operations that are not flushes flushed: %v", c.flushes)
	}
	for op, want := range map[string]flush.Scope{
		admin.OpFlush + "?name=a.example": flush.Names, admin.OpFlushType + "?name=a.example&type=MX": flush.Names,
		admin.OpFlushZone + "?zone=example": flush.Zones, admin.OpFlushNegative: flush.Negative,
		admin.OpFlushExpired: flush.Expired, admin.OpFlushAll: flush.All,
	} {
		c.flushes = nil
		if code := do(http.MethodPost, "/v1/"+op); code != http.StatusOK || len(c.flushes) != 1 || c.flushes[0].Scope != want {
			t.Errorf("POST %s: %d, flushes %v, want one of scope %s", op, code, c.flushes, want)
		}
	}
}

// TestAdminBlocksOne: blocks?block=NAME lists that block alone; without
// block, every block.
func TestAdminBlocksOne(t *testing.T) {
	inst := &adminInstance{cfg: adminConfig{addr: "127.0.0.1:1", insecure: true}}
	s := &adminServer{blocks: []*adminBlock{
		{inst: inst, c: &recordingCache{}, info: admin.Block{Name: "a"}},
		{inst: inst, c: &recordingCache{}, info: admin.Block{Name: "b"}},
	}}
	for target, want := range map[string]string{"/v1/blocks": "a b", "/v1/blocks?block=b": "b", "/v1/blocks?block=a": "a"} {
		r := httptest.NewRequest(http.MethodGet, target, nil)
		r.Host = "127.0.0.1"
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		var reply admin.Blocks
		json.Unmarshal(w.Body.Bytes(), &reply)
		var names []string
		for _, b := range reply.Blocks {
			names = append(names, b.Name)
		}
		if w.Code != http.StatusOK || strings.Join(names, " ") != want {
			t.Errorf("GET %s: %d, blocks %q, want %q", target, w.Code, names, want)
		}
	}
}

// TestAdminDumpEmptyFormat: an empty format is refused as an unknown one
// is, not taken for text; format given or not, the known ones are taken.
func TestAdminDumpEmptyFormat(t *testing.T) {
	s := &adminServer{blocks: []*adminBlock{{inst: &adminInstance{cfg: adminConfig{addr: "127.0.0.1:1", insecure: true}}, c: &recordingCache{}, info: admin.Block{Name: "b"}}}}
	for target, want := range map[string]int{
		"/v1/dump": 200, "/v1/dump?format=text": 200, "/v1/dump?format=json": 200,
		"/v1/dump?format=": 400, "/v1/dump?format": 400, "/v1/dump?format=xml": 400,
	} {
		r := httptest.NewRequest(http.MethodGet, target, nil)
		r.Host = "127.0.0.1"
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		var e admin.Error
		json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != want || (want == 400 && (e.Field != "format" || !strings.Contains(e.Error, "is not text or json"))) {
			t.Errorf("GET %s: %d %s, want %d", target, w.Code, w.Body, want)
		}
	}
}

// countingCache is a recordingCache that counts its walks, snapshots and stats.
type countingCache struct {
	recordingCache
	walks, snapshots, stats int
}

func (c *countingCache) Stats() admin.Stats { c.stats++; return admin.Stats{} }

func (c *countingCache) Walk(func(entry.Entry), func() error) error { c.walks++; return nil }
func (c *countingCache) Snapshot(io.Writer) (int, error)            { c.snapshots++; return 0, nil }

// TestAdminHead: HEAD is served wherever GET is, with GET's status and
// Content-Type, and without walking the store for a body net/http drops; an
// operation that takes POST refuses it as any other method, and flushes
// nothing.
func TestAdminHead(t *testing.T) {
	c := &countingCache{}
	s := &adminServer{blocks: []*adminBlock{{inst: &adminInstance{cfg: adminConfig{addr: "127.0.0.1:1", insecure: true}}, c: c, info: admin.Block{Name: "b"}}}}
	for _, tc := range []struct {
		target      string
		code        int
		contentType string
	}{
		{"/v1/blocks", 200, "application/json"},
		{"/v1/stats", 200, "application/json"},
		{"/v1/lookup?name=www.example.org", 200, "application/json"},
		{"/v1/dump", 200, admin.ContentTypeText},
		{"/v1/dump?format=json", 200, admin.ContentTypeJSONLines},
		{"/v1/snapshot?block=b", 200, "application/octet-stream"},
		{"/v1/lookup?name=a..b", 400, "application/json"},
		{"/v1/snapshot?block=nope", 404, "application/json"},
		{"/v1/flush_all", 405, "application/json"},
		{"/v1/flush?name=www.example.org", 405, "application/json"},
	} {
		r := httptest.NewRequest(http.MethodHead, tc.target, nil)
		r.Host = "127.0.0.1"
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != tc.code || w.Header().Get("Content-Type") != tc.contentType {
			t.Errorf("HEAD %s: %d, Content-Type %q; want %d, %q", tc.target, w.Code, w.Header().Get("Content-Type"), tc.code, tc.contentType)
		}
		if tc.code == 405 && w.Header().Get("Allow") != http.MethodPost {
			t.Errorf("HEAD %s: Allow %q, want POST", tc.target, w.Header().Get("Allow"))
		}
	}
	if len(c.flushes) != 0 || c.walks != 0 || c.snapshots != 0 || c.stats != 0 {
		t.Errorf("HEAD requests flushed %v, walked the store %d times, snapshot it %d times, counted it %d times; want none", c.flushes, c.walks, c.snapshots, c.stats)
	}
	// GET's Allow names HEAD too, for a method GET takes that is not.
	r := httptest.NewRequest(http.MethodPost, "/v1/stats", nil)
	r.Host = "127.0.0.1"
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	if w.Code != 405 || w.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /v1/stats: %d, Allow %q; want 405, GET, HEAD", w.Code, w.Header().Get("Allow"))
	}
}

// TestAdminLongValuesCut: a refusal quotes a value of the caller's cut
// short, whatever its length: not the megabyte of a type, a block or a
// parameter's name back whole.
func TestAdminLongValuesCut(t *testing.T) {
	s := &adminServer{blocks: []*adminBlock{{inst: &adminInstance{cfg: adminConfig{addr: "127.0.0.1:1", insecure: true}}, c: &recordingCache{}, info: admin.Block{Name: "b"}}}}
	long := strings.Repeat("x", 64<<10)
	longName := strings.Repeat("a.", 400) + "..b" // under the cap on names, and refused
	for _, tc := range []struct {
		method, target, field string
		code                  int
	}{
		{"GET", "/v1/lookup?name=a&type=" + long, "type", 400},
		{"GET", "/v1/dump?format=" + long, "format", 400},
		{"GET", "/v1/stats?block=" + long, "block", 404},
		{"GET", "/v1/lookup?name=" + longName, "name", 400},
		{"POST", "/v1/flush_zone?zone=" + longName, "zone", 400},
		{"GET", "/v1/stats?" + long + "=1", strings.Repeat("x", 200), 400},
		{"GET", "/v1/stats?" + long + "=1&" + long + "=2", strings.Repeat("x", 200), 400},
		{"GET", "/v1/" + long, "", 404},
	} {
		r := httptest.NewRequest(tc.method, tc.target, nil)
		r.Host = "127.0.0.1"
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		var e admin.Error
		json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != tc.code || e.Field != tc.field || len(e.Error) > 500 {
			t.Errorf("%s %.60s...: %d, field %.60q, error of %d bytes %.300q; want %d, field %.60q, the value cut", tc.method, tc.target, w.Code, e.Field, len(e.Error), e.Error, tc.code, tc.field)
		}
	}
}
