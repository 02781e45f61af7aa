package adminserver

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/miekg/dns"
	"golang.org/x/net/idna"
)

// The admin endpoint's HTTP side: the operations of internal/admin, each
// at /v1/OP, behind a bearer token.

var (
	adminRequests = cachemetrics.CounterVec("admin_requests_total", []string{"op", "code"},
		"The requests to the admin endpoint, by operation and HTTP status.")
	adminUnauthorized = cachemetrics.CounterVec("admin_unauthorized_total", []string{"reason"},
		"The admin requests refused for their bearer token: missing or wrong.")
)

// adminRequest is one request, parsed.
type adminRequest struct {
	op     string
	blocks []*adminBlock // those it addresses
	name   []byte        // name or zone, lowercased wire form
	text   string        // the same in presentation form, for the log
	types  []uint16
	format string
	who    string // the client, for the log
}

func (s *adminServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w, code: http.StatusOK, timeout: s.writeTimeout}
	op, _ := strings.CutPrefix(r.URL.Path, admin.Prefix)
	spec, known := admin.Specs[op]
	label := op
	if !known {
		label = "unknown" // a bounded set of label values
	}
	defer func() { adminRequests.WithLabelValues(label, strconv.Itoa(sw.code)).Inc() }()

	inst, blocks := s.view()
	if inst == nil {
		adminError(sw, http.StatusServiceUnavailable, "", "no block is registered")
		return
	}
	if code, msg := authorize(inst, r); code != 0 {
		if code == http.StatusUnauthorized {
			sw.Header().Set("WWW-Authenticate", `Bearer realm="compactcache"`)
		}
		adminError(sw, code, "", msg)
		return
	}
	if !known {
		adminError(sw, http.StatusNotFound, "", fmt.Sprintf("no operation %s; the operations are %s", admin.Quote(r.URL.Path), strings.Join(slices.Sorted(maps.Keys(admin.Specs)), ", ")))
		return
	}
	head := r.Method == http.MethodHead && spec.Method == http.MethodGet
	if r.Method != spec.Method && !head {
		allow := spec.Method
		if spec.Method == http.MethodGet {
			allow += ", " + http.MethodHead
		}
		sw.Header().Set("Allow", allow)
		adminError(sw, http.StatusMethodNotAllowed, "", fmt.Sprintf("%s takes %s", op, allow))
		return
	}
	req, code, field, err := parseAdminRequest(op, spec, r, blocks)
	if err != nil {
		adminError(sw, code, field, err.Error())
		return
	}
	if head {
		// GET's status and headers, as health checks ask for them, without
		// the operation: stats and the dump walk the whole store, the
		// snapshot too, for a body net/http would drop.
		sw.Header().Set("Content-Type", contentType(req))
		return
	}
	req.who = r.RemoteAddr
	if ua := r.UserAgent(); ua != "" {
		req.who += " (" + ua + ")"
	}
	switch op {
	case admin.OpBlocks:
		reply := admin.Blocks{Blocks: []admin.Block{}}
		for _, b := range req.blocks {
			reply.Blocks = append(reply.Blocks, b.info)
		}
		adminJSON(sw, reply)
	case admin.OpStats:
		reply := admin.StatsReply{Blocks: []admin.Stats{}}
		for _, b := range req.blocks {
			st := b.c.Stats()
			st.Block = b.info.Name
			reply.Blocks = append(reply.Blocks, st)
		}
		adminJSON(sw, reply)
	case admin.OpLookup:
		reply := admin.LookupReply{Blocks: []admin.BlockEntries{}}
		for _, b := range req.blocks {
			found := Lookup(b.c, req.name, req.types)
			reply.Blocks = append(reply.Blocks, admin.BlockEntries{Block: b.info.Name, Entries: found})
		}
		adminJSON(sw, reply)
	case admin.OpDump:
		serveDump(sw, req)
	case admin.OpSnapshot:
		b := req.blocks[0]
		sw.Header().Set("Content-Type", contentType(req))
		if n, err := b.c.Snapshot(sw); err != nil {
			log.Warningf("Admin: the snapshot of %s to %s stopped after %d entries: %v", b.info.Name, req.who, n, err)
		}
	case admin.OpFlush, admin.OpFlushType, admin.OpFlushZone, admin.OpFlushNegative, admin.OpFlushExpired, admin.OpFlushAll:
		reply := admin.FlushReply{Op: op, Blocks: []admin.Flushed{}}
		for _, b := range req.blocks {
			reply.Blocks = append(reply.Blocks, flushBlock(b, req))
		}
		adminJSON(sw, reply)
	default:
		// An operation the API lists that this server does not serve: never
		// taken for a flush.
		adminError(sw, http.StatusNotFound, "", fmt.Sprintf("no operation %q on this server", op))
	}
}

// authorize returns 0, or the status and message of a refusal. Without a
// token (insecure_loopback) requests that a browser could have sent for a
// web page are refused: a page may POST to the loopback without the
// operator knowing, and a name rebound to 127.0.0.1 may read the reply.
func authorize(inst *adminInstance, r *http.Request) (int, string) {
	if inst.cfg.insecure {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		if r.Header.Get("Origin") != "" || r.Header.Get("Sec-Fetch-Mode") != "" || !loopback(strings.Trim(host, "[]")) {
			return http.StatusForbidden, "insecure_loopback takes no requests from browsers, nor for a Host that is not the loopback"
		}
		return 0, ""
	}
	// The scheme is matched in any case (RFC 9110 11.1).
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	ok = ok && strings.EqualFold(scheme, "Bearer")
	switch {
	case !ok || tok == "":
		adminUnauthorized.WithLabelValues("missing").Inc()
		return http.StatusUnauthorized, "want the header Authorization: Bearer TOKEN"
	case !inst.token.matches(strings.TrimSpace(tok)):
		adminUnauthorized.WithLabelValues("wrong").Inc()
		return http.StatusUnauthorized, "wrong token"
	}
	return 0, ""
}

// parseAdminRequest reads the parameters of an op; on error it returns the
// status, the field at fault and what is wrong with it.
func parseAdminRequest(op string, spec admin.Spec, r *http.Request, blocks []*adminBlock) (req adminRequest, code int, field string, err error) {
	req.op, req.format = op, admin.FormatText
	q, field, err := parseQuery(r.URL.RawQuery)
	if err != nil {
		return req, http.StatusBadRequest, field, err
	}
	for k := range q {
		if k != admin.ParamBlock && !slices.Contains(spec.Required, k) && !slices.Contains(spec.Optional, k) {
			return req, http.StatusBadRequest, admin.Cut(k), fmt.Errorf("%s: %s takes no parameter %s", admin.Cut(k), op, admin.Quote(k))
		}
	}
	for _, k := range spec.Required {
		if q.Get(k) == "" {
			return req, http.StatusBadRequest, k, fmt.Errorf("%s: missing; %s takes %s", k, op, strings.Join(spec.Required, ", "))
		}
	}
	for _, k := range []string{"name", "zone"} {
		if v := q.Get(k); v != "" {
			if req.name, err = adminName(v); err != nil {
				return req, http.StatusBadRequest, k, fmt.Errorf("%s: %w", k, err)
			}
			// For the log, from the wire: escaped, whatever bytes v held.
			req.text, _, _ = dns.UnpackDomainName(req.name, 0)
		}
	}
	if vals, ok := q["type"]; ok {
		// Given empty, it is refused: lookup takes every type without one.
		v := vals[0]
		t, ok := parseType(v)
		if !ok {
			return req, http.StatusBadRequest, "type", fmt.Errorf("type: %s is not a DNS type such as A, AAAA, MX or TYPE65280", admin.Quote(v))
		}
		req.types = []uint16{t}
		req.text += " " + dns.Type(t).String()
	}
	if vals, ok := q["format"]; ok {
		// Given empty, it is refused too: text is the format without one.
		v := vals[0]
		if v != admin.FormatText && v != admin.FormatJSON {
			return req, http.StatusBadRequest, "format", fmt.Errorf("format: %s is not %s or %s", admin.Quote(v), admin.FormatText, admin.FormatJSON)
		}
		req.format = v
	}
	req.blocks = blocks
	if v, ok := q[admin.ParamBlock]; ok {
		i := slices.IndexFunc(blocks, func(b *adminBlock) bool { return b.info.Name == v[0] })
		if i < 0 {
			names := make([]string, len(blocks))
			for j, b := range blocks {
				names[j] = strconv.Quote(b.info.Name)
			}
			return req, http.StatusNotFound, admin.ParamBlock, fmt.Errorf("block: no block %s; the blocks are %s", admin.Quote(v[0]), strings.Join(names, ", "))
		}
		req.blocks = blocks[i : i+1]
	}
	return req, 0, "", nil
}

// queryValues are a request's parameters, each given once.
type queryValues map[string][]string

func (q queryValues) Get(k string) string {
	if v := q[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// parseQuery parses a query string, refusing a parameter given twice: an
// operator who wrote two names meant something this does not do. On error
// it names the parameter at fault, if one is.
func parseQuery(raw string) (queryValues, string, error) {
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return nil, "", fmt.Errorf("the query string does not parse: %v", err)
	}
	for k, v := range vals {
		if len(v) > 1 {
			return nil, admin.Cut(k), fmt.Errorf("%s: given %d times", admin.Cut(k), len(v))
		}
	}
	return queryValues(vals), "", nil
}

// maxNameText bounds a name in presentation form: each byte of its wire
// form as \DDD, or a code point of four bytes of UTF-8.
const maxNameText = 4 * dnsmsg.MaxNameLen

// adminName packs a name in presentation form, lowercased, as keys hold it.
func adminName(s string) ([]byte, error) {
	if strings.TrimSpace(s) != s || s == "" {
		return nil, fmt.Errorf("%s is not a domain name", admin.Quote(s))
	}
	if len(s) > maxNameText {
		// Not quoted back, nor given to IDNA, whose encoding of a long
		// label takes time quadratic in its length.
		return nil, fmt.Errorf("%d bytes, longer than any domain name", len(s))
	}
	if !isASCII(s) {
		// Clients ask for an internationalized name in its A-labels
		// (RFC 5891): the name as an operator reads it would match none
		// of its entries.
		a, err := toASCII(s)
		if err != nil {
			return nil, fmt.Errorf("%s is not a domain name: %v", admin.Quote(s), err)
		}
		s = a
	}
	var buf [dnsmsg.MaxNameLen]byte
	n, err := dnsmsg.PackName(dns.Fqdn(s), buf[:])
	if err != nil {
		return nil, fmt.Errorf("%s is not a domain name: %v", admin.Quote(s), err)
	}
	name := buf[:n]
	dnsmsg.LowerInPlace(name)
	return slices.Clone(name), nil
}

// toASCII replaces each label of s that is not ASCII by its A-label. The
// ASCII labels stay as they are: IDNA refuses the underscores of
// _443._tcp.bücher.example and the wildcard of *.bücher.example, which
// are DNS names all the same. A backslash escapes the byte after it; one
// that ends s stays in its label, which is then refused, rather than
// taking the end of s with it.
func toASCII(s string) (string, error) {
	var b strings.Builder
	start := 0
	for i := 0; i <= len(s); i++ {
		switch {
		case i+1 < len(s) && s[i] == '\\':
			i++
		case i == len(s) || s[i] == '.':
			label := s[start:i]
			if !isASCII(label) {
				a, err := idna.Lookup.ToASCII(label)
				if err != nil {
					return "", err
				}
				label = a
			}
			b.WriteString(label)
			if i < len(s) {
				b.WriteByte('.')
			}
			start = i + 1
		}
	}
	return b.String(), nil
}

func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// parseType parses a type mnemonic (any case) or TYPEnnn (RFC 3597).
func parseType(s string) (uint16, bool) {
	if t, ok := dns.StringToType[strings.ToUpper(s)]; ok {
		return t, true
	}
	if n, ok := strings.CutPrefix(strings.ToUpper(s), "TYPE"); ok {
		if t, err := strconv.ParseUint(n, 10, 16); err == nil {
			return uint16(t), true
		}
	}
	return 0, false
}

// flushOf returns the flush req asks for.
func flushOf(req adminRequest) flush.Flush {
	switch req.op {
	case admin.OpFlush, admin.OpFlushType:
		return flush.Flush{Scope: flush.Names, Names: [][]byte{req.name}, Types: req.types}
	case admin.OpFlushZone:
		return flush.Flush{Scope: flush.Zones, Names: [][]byte{req.name}}
	case admin.OpFlushNegative:
		return flush.Flush{Scope: flush.Negative}
	case admin.OpFlushExpired:
		return flush.Flush{Scope: flush.Expired}
	case admin.OpFlushAll:
		return flush.Flush{Scope: flush.All}
	}
	panic("admin: " + req.op + " is not a flush")
}

// flushBlock runs a flush on one block and logs what it removed and for
// whom.
func flushBlock(b *adminBlock, req adminRequest) admin.Flushed {
	start := time.Now()
	n, err := b.c.Flush(flushOf(req))
	took := time.Since(start)
	what := req.op
	if req.text != "" {
		what += " " + req.text
	}
	log.Infof("admin: %s in %s by %s: removed %d entries (%d success, %d denial, %d ECS lists) in %s",
		what, b.info.Name, req.who, n.Total(), n.Success, n.Denial, n.ECSList, took.Round(time.Microsecond))
	fl := admin.Flushed{Block: b.info.Name, Removed: n, Seconds: took.Seconds()}
	if err != nil {
		fl.Error = err.Error()
	}
	return fl
}

// serveDump streams every entry of the blocks, a chunk of the store at a
// time, flushed to the client after each; no lock is held while it writes.
func serveDump(w *statusWriter, req adminRequest) {
	log.Infof("admin: dump (%s) of %d blocks by %s", req.format, len(req.blocks), req.who)
	w.Header().Set("Content-Type", contentType(req))
	// The reply begun at once: the walk may go far before its first
	// entry, and a client bounds its wait for a reply to begin.
	w.Flush()
	bw := bufio.NewWriterSize(w, 64<<10)
	var line []byte
	for _, b := range req.blocks {
		if req.format == admin.FormatText {
			fmt.Fprintf(bw, "; block %s\n", b.info.Name)
		}
		err := dump(b.c, func(batch []admin.Entry) error {
			for i := range batch {
				e := &batch[i]
				if req.format == admin.FormatJSON {
					e.Block = b.info.Name
					j, err := json.Marshal(e)
					if err != nil {
						return err
					}
					line = append(append(line[:0], j...), '\n')
				} else {
					line = e.AppendText(line[:0])
				}
				if _, err := bw.Write(line); err != nil {
					return err
				}
			}
			if err := bw.Flush(); err != nil {
				return err
			}
			w.Flush()
			return nil
		})
		if err != nil {
			log.Infof("admin: dump by %s ended: %v", req.who, err)
			return
		}
	}
	bw.Flush()
}

// statusWriter keeps the status written, for the metric, and gives each
// write timeout (0: none).
type statusWriter struct {
	http.ResponseWriter
	code    int
	timeout time.Duration
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.extend()
	return w.ResponseWriter.Write(b)
}

// Flush sends what is buffered to the client.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		w.extend()
		f.Flush()
	}
}

// extend gives the connection's next write the timeout from now. The
// server clears the deadline once the reply is sent.
func (w *statusWriter) extend() {
	if w.timeout > 0 {
		http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Now().Add(w.timeout))
	}
}

// contentType returns the media type of req's reply.
func contentType(req adminRequest) string {
	switch {
	case req.op == admin.OpSnapshot:
		return "application/octet-stream"
	case req.op == admin.OpDump && req.format == admin.FormatJSON:
		return admin.ContentTypeJSONLines
	case req.op == admin.OpDump:
		return admin.ContentTypeText
	}
	return contentTypeJSON
}

const contentTypeJSON = "application/json"

func adminJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", contentTypeJSON)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func adminError(w http.ResponseWriter, code int, field, msg string) {
	w.Header().Set("Content-Type", contentTypeJSON)
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(admin.Error{Error: msg, Field: field})
}

// Lookup describes every entry of name with one of types, but the ECS
// lists, as the lookup operation answers.
func Lookup(c Cache, name []byte, types []uint16) []admin.Entry {
	var held []byte // the entries found, copied out under their shard's lock
	c.Entries(name, types, func(e entry.Entry) {
		if store.KindOf(e) != store.KindMeta {
			held = append(held, e...)
		}
	})
	return describeAll(held, c.Now(), c.Grace(), []admin.Entry{})
}

// dump describes every entry but the ECS lists, a chunk at a time: each
// chunk's entries are copied out under its lock and described and handed
// to each, whose error ends the dump, with no lock held.
func dump(c Cache, each func(batch []admin.Entry) error) error {
	var held []byte
	var batch []admin.Entry
	return c.Walk(func(e entry.Entry) {
		if store.KindOf(e) != store.KindMeta {
			held = append(held, e...)
		}
	}, func() error {
		if len(held) == 0 {
			return nil
		}
		batch = describeAll(held, c.Now(), c.Grace(), batch[:0])
		held = held[:0]
		return each(batch)
	})
}
