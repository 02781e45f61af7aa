// Command compactcache-ctl flushes, looks up, dumps and counts what the
// compactcache blocks of one or more CoreDNS servers hold, through their
// admin endpoint (the compactcache option `admin`), as unbound-control does
// for Unbound:
//
//	compactcache-ctl [OPTIONS] COMMAND [ARGS]
//
//	flush NAME             every type and ECS variant of NAME
//	flush_type NAME TYPE   NAME's TYPE
//	flush_zone ZONE        every name at or below ZONE
//	flush_negative         NXDOMAIN, NODATA and SERVFAIL entries
//	flush_expired          entries past their TTL, stale ones included
//	flush_all              everything
//	lookup NAME [TYPE]     what is cached for NAME, as zone-file text
//	dump                   every entry, as zone-file text (--json: JSON lines)
//	stats                  entries, bytes, evictions, hit ratio
//	blocks                 the server blocks and their zones
//
// Options may come before or after the command. --server (repeated, or
// comma-separated) names the servers, asked at once; each --then names
// servers asked only once every server before it has succeeded: cluster
// DNS first, then the node-local caches that forward to it, so that no
// node-local cache fetches again an answer cluster DNS has yet to drop.
// Exit status: 0 when every server did it, 1 when some did not (the
// servers after the stage that failed are not asked), 2 for a usage error.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
)

// defaultServer is where the tool looks without --server: the address the
// README's examples give the endpoint, on the loopback, as inside the pod.
const defaultServer = "127.0.0.1:9154"

const usage = `usage: compactcache-ctl [OPTIONS] COMMAND [ARGS]

Commands:
  flush NAME             every type and ECS variant of NAME
  flush_type NAME TYPE   NAME's TYPE
  flush_zone ZONE        every name at or below ZONE
  flush_negative         NXDOMAIN, NODATA and SERVFAIL entries
  flush_expired          entries past their TTL, stale ones included
  flush_all              everything
  lookup NAME [TYPE]     what is cached for NAME, as zone-file text
  dump                   every entry, as zone-file text (--json: JSON lines)
  stats                  entries, bytes, evictions, hit ratio
  blocks                 the server blocks and their zones

Options:
`

// exit statuses
const (
	exitOK     = 0
	exitFailed = 1 // some server did not do it
	exitUsage  = 2
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// listFlag is a repeatable option whose values may be comma-separated; each
// use is kept apart.
type listFlag [][]string

func (l *listFlag) String() string { return fmt.Sprint(*l) }

func (l *listFlag) Set(v string) error {
	var vals []string
	for s := range strings.SplitSeq(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			vals = append(vals, s)
		}
	}
	if len(vals) == 0 {
		return errors.New("no address")
	}
	*l = append(*l, vals)
	return nil
}

// options are the command line's options.
type options struct {
	servers, then listFlag
	tokenFile     string
	block         string
	json          bool
	timeout       time.Duration
	eachAddress   bool
}

func run(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("compactcache-ctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	fs.Var(&o.servers, "server", "`ADDR`[,ADDR...] of admin endpoints (HOST:PORT, or a URL), asked at once; repeatable (default $COMPACTCACHE_SERVER or "+defaultServer+")")
	fs.Var(&o.then, "then", "`ADDR`[,ADDR...] asked once every server before has succeeded: each --then is a stage")
	fs.StringVar(&o.tokenFile, "token-file", os.Getenv("COMPACTCACHE_TOKEN_FILE"), "`PATH` of the bearer token (default $COMPACTCACHE_TOKEN_FILE; none for insecure_loopback)")
	fs.StringVar(&o.block, "block", "", "the server block `NAME` to address, as blocks lists it (default: every block)")
	fs.BoolVar(&o.json, "json", false, "print the replies as JSON (dump: JSON lines)")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "how long to wait for a server, each; 0 for ever (dump: for its reply to begin)")
	fs.BoolVar(&o.eachAddress, "each-address", false, "ask every address a server's host name resolves to (the pods of a headless Service)")

	// Options may come after the command and its arguments too.
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK
			}
			return exitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	if len(pos) == 0 {
		fs.Usage()
		return exitUsage
	}
	if o.timeout < 0 {
		fmt.Fprintf(stderr, "compactcache-ctl: --timeout %s: want a duration of 0 (for ever) or more\n", o.timeout)
		return exitUsage
	}
	op, params, err := command(pos, o)
	if err != nil {
		fmt.Fprintf(stderr, "compactcache-ctl: %v (compactcache-ctl -h for usage)\n", err)
		return exitUsage
	}
	if len(o.servers) == 0 {
		def := os.Getenv("COMPACTCACHE_SERVER")
		if def == "" {
			def = defaultServer
		}
		if err := o.servers.Set(def); err != nil {
			fmt.Fprintf(stderr, "compactcache-ctl: $COMPACTCACHE_SERVER: %v\n", err)
			return exitUsage
		}
	}
	var token string
	if o.tokenFile != "" {
		b, err := admin.ReadToken(o.tokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "compactcache-ctl: --token-file: %v\n", err)
			return exitUsage
		}
		if len(b) == 0 {
			// Asked without a token, the server would answer 401.
			fmt.Fprintf(stderr, "compactcache-ctl: --token-file %s: holds no token (the file is empty, or white space only)\n", o.tokenFile)
			return exitUsage
		}
		token = string(b)
	}
	stages, err := stagesOf(o)
	if err != nil {
		fmt.Fprintf(stderr, "compactcache-ctl: %v\n", err)
		return exitUsage
	}
	c := &client{token: token, timeout: o.timeout, json: o.json, agent: userAgent()}
	// The head of every reply within the timeout: a dump's stream has no
	// limit, but a server that never begins it fails.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = o.timeout
	c.http.Transport = tr
	return c.runStages(op, params, stages, stdout, stderr)
}

// command returns the operation the positional arguments ask for and its
// parameters.
func command(pos []string, o options) (string, url.Values, error) {
	op, args := pos[0], pos[1:]
	spec, ok := admin.Specs[op]
	if !ok {
		return "", nil, fmt.Errorf("unknown command %q", op)
	}
	if op == admin.OpSnapshot {
		// A binary stream for a peer's warmup, which this tool has no
		// form for.
		return "", nil, errors.New("snapshot is not a command: it streams a block's store in binary, what a peer's warmup reads; " +
			"dump shows the entries, and GET /v1/snapshot?block=NAME (curl) saves the stream")
	}
	takes := slices.DeleteFunc(slices.Concat(spec.Required, spec.Optional), func(p string) bool { return p == "format" })
	if len(args) < len(spec.Required) || len(args) > len(takes) {
		want := strings.ToUpper(strings.Join(spec.Required, " "))
		if len(takes) > len(spec.Required) {
			want += " [" + strings.ToUpper(strings.Join(takes[len(spec.Required):], " ")) + "]"
		}
		if want == "" {
			want = "no arguments"
		}
		return "", nil, fmt.Errorf("%s takes %s, got %d arguments", op, want, len(args))
	}
	params := url.Values{}
	for i, a := range args {
		params.Set(takes[i], a)
	}
	if o.block != "" {
		if v := params.Get(admin.ParamBlock); v != "" && v != o.block {
			return "", nil, fmt.Errorf("--block %q and the argument BLOCK %q differ: give one", o.block, v)
		}
		params.Set(admin.ParamBlock, o.block)
	}
	if op == admin.OpDump && o.json {
		params.Set("format", admin.FormatJSON)
	}
	return op, params, nil
}

// target is one server to ask: its base URL, and why it cannot be asked
// when it cannot (a host name --each-address could not resolve), which
// fails it as a server that does not answer fails.
type target struct {
	server string
	err    error
}

// stagesOf returns the servers of each stage. A server that is not
// HOST:PORT or an http(s) URL is a usage error.
func stagesOf(o options) ([][]target, error) {
	groups := [][]string{slices.Concat(o.servers...)}
	groups = append(groups, o.then...)
	var stages [][]target
	for _, g := range groups {
		var stage []target
		for _, s := range g {
			u, err := serverURL(s)
			if err != nil {
				return nil, err
			}
			stage = append(stage, eachAddress(u, o.eachAddress)...)
		}
		stages = append(stages, stage)
	}
	return stages, nil
}

// serverURL returns the base URL of a server given as HOST:PORT or a URL.
func serverURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("--server %q is not HOST:PORT or an http(s) URL", s)
	}
	if u.User != nil {
		// Printed with every line of the server's, and the endpoint takes
		// none but a bearer token.
		return nil, fmt.Errorf("--server %q holds credentials: the endpoint takes a bearer token, from --token-file", u.Redacted())
	}
	if u.Port() == "" {
		return nil, fmt.Errorf("--server %q has no port", s)
	}
	u.Path, u.RawQuery = strings.TrimSuffix(u.Path, "/"), ""
	return u, nil
}

// eachAddress returns the server at u; with each, one for every address
// its host resolves to, or the server with the error of the lookup.
func eachAddress(u *url.URL, each bool) []target {
	if !each || net.ParseIP(u.Hostname()) != nil {
		return []target{{server: u.String()}}
	}
	addrs, err := lookupHost(u.Hostname())
	if err != nil {
		return []target{{server: u.String(), err: fmt.Errorf("--each-address: %v", err)}}
	}
	slices.Sort(addrs)
	var targets []target
	for _, a := range addrs {
		v := *u
		v.Host = net.JoinHostPort(a, u.Port())
		targets = append(targets, target{server: v.String()})
	}
	return targets
}

// lookupHost resolves a host name for --each-address; tests replace it.
var lookupHost = net.LookupHost

// userAgent names the tool and the operator, for the server's log.
func userAgent() string {
	who := "unknown"
	if u, err := user.Current(); err == nil {
		who = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		who += "@" + h
	}
	return "compactcache-ctl (" + who + ")"
}

// client asks servers.
type client struct {
	token   string
	timeout time.Duration
	json    bool
	agent   string
	http    http.Client
}

// result is what one server answered, printed once its stage is over.
type result struct {
	server string
	out    bytes.Buffer
	err    error
}

// runStages asks each stage's servers at once, in order, and stops after a
// stage in which one failed.
func (c *client) runStages(op string, params url.Values, stages [][]target, stdout, stderr io.Writer) int {
	many := len(stages) > 1 || len(stages[0]) > 1
	for i, stage := range stages {
		failed := false
		if op == admin.OpDump {
			// Streamed as it comes, a server after the other.
			for _, t := range stage {
				s := t.server
				if t.err != nil {
					fmt.Fprintf(stderr, "compactcache-ctl: %s: %v\n", s, t.err)
					failed = true
					continue
				}
				var out io.Writer = stdout
				lines := &jsonLines{w: stdout, server: s}
				switch {
				case many && c.json:
					out = lines // JSON Lines all the same: a line each entry, naming its server
				case many:
					fmt.Fprintf(stdout, "; server %s\n", s)
				}
				err := c.do(op, s, params, out)
				lines.Write([]byte{'\n'}) // a last line without its newline
				if err != nil {
					fmt.Fprintf(stderr, "compactcache-ctl: %s: %v\n", s, err)
					failed = true
				}
			}
		} else {
			results := make([]result, len(stage))
			var wg sync.WaitGroup
			for j, t := range stage {
				results[j].server, results[j].err = t.server, t.err
				if t.err == nil {
					wg.Go(func() { results[j].err = c.do(op, t.server, params, &results[j].out) })
				}
			}
			wg.Wait()
			for _, r := range results {
				switch {
				case many && c.json && r.out.Len() > 0:
					jsonLine(stdout, r.server, r.out.Bytes())
				case many && r.out.Len() > 0:
					prefix(stdout, r.server, r.out.Bytes())
				default:
					stdout.Write(r.out.Bytes())
				}
				if r.err != nil {
					fmt.Fprintf(stderr, "compactcache-ctl: %s: %v\n", r.server, r.err)
					failed = true
				}
			}
		}
		if failed {
			var rest []string
			for _, t := range slices.Concat(stages[i+1:]...) {
				rest = append(rest, t.server)
			}
			if len(rest) > 0 {
				fmt.Fprintf(stderr, "compactcache-ctl: not asked, since a server before them failed: %s\n", strings.Join(rest, ", "))
			}
			return exitFailed
		}
	}
	return exitOK
}

// jsonLine writes reply, the JSON of one server's, to w as one line of JSON
// that names the server, so that the replies of several stay JSON (JSON
// Lines).
func jsonLine(w io.Writer, server string, reply []byte) {
	var line bytes.Buffer
	raw := json.RawMessage(nil)
	if json.Compact(&line, reply) == nil {
		raw = line.Bytes()
	} else {
		raw, _ = json.Marshal(string(bytes.TrimSpace(reply))) // not JSON: as a string
	}
	b, _ := json.Marshal(struct {
		Server string          `json:"server"`
		Reply  json.RawMessage `json:"reply"`
	}{server, raw})
	w.Write(append(b, '\n'))
}

// jsonLines writes each line of JSON written to it to w as jsonLine does.
type jsonLines struct {
	w      io.Writer
	server string
	buf    []byte // a line not yet whole
}

func (j *jsonLines) Write(b []byte) (int, error) {
	j.buf = append(j.buf, b...)
	for {
		i := bytes.IndexByte(j.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		if i > 0 {
			jsonLine(j.w, j.server, j.buf[:i])
		}
		j.buf = j.buf[i+1:]
	}
}

// prefix writes each line of b to w after "server: ".
func prefix(w io.Writer, server string, b []byte) {
	for line := range bytes.Lines(b) {
		fmt.Fprintf(w, "%s: %s", server, line)
	}
}

// maxReply bounds a reply read whole, every one but a dump's, which is
// streamed: a lookup's holds every entry of one name in each block, up to
// max_variants (at most 1,000) ECS variants of each type, each of up to
// 64 KiB of records.
var maxReply = 256 << 20

// do asks server for op and writes what it answered to out, as text or,
// with --json, as it came.
func (c *client) do(op, server string, params url.Values, out io.Writer) error {
	ctx := context.Background()
	if c.timeout > 0 && op != admin.OpDump {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	u := server + admin.Prefix + op
	if len(params) > 0 {
		u += "?" + params.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, admin.Specs[op].Method, u, nil)
	if err != nil {
		return err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("User-Agent", c.agent)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e admin.Error
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return fmt.Errorf("%s: %s", resp.Status, printable(e.Error))
		}
		// Not the endpoint's: a proxy's page, quoted and cut short.
		return fmt.Errorf("%s: %s", resp.Status, admin.Quote(string(bytes.TrimSpace(body))))
	}
	if op == admin.OpDump {
		if ct := resp.Header.Get("Content-Type"); !isDump(ct) {
			return fmt.Errorf("the reply is not a dump (%s), so not a compactcache admin endpoint's", ct)
		}
		_, err := io.Copy(out, resp.Body)
		return err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(maxReply)+1))
	if err != nil {
		return err
	}
	if len(body) > maxReply {
		return fmt.Errorf("a reply over %d MiB: not read on", maxReply>>20)
	}
	if !json.Valid(body) {
		// Another service on the port, or a proxy's page: not a reply to
		// the operation, which --json would pass on as one.
		return fmt.Errorf("the reply is not JSON (%s), so not a compactcache admin endpoint's: %.80q", resp.Header.Get("Content-Type"), body)
	}
	if c.json {
		out.Write(body)
	} else if err := printReply(op, body, out); err != nil {
		return err
	}
	return flushFailed(op, body)
}

// printable returns a server's error as it came when it prints, quoted
// otherwise: the server, or a proxy in between, could have put terminal
// control characters in it. JSON decoding has made it UTF-8.
func printable(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}

// isDump reports whether a reply of Content-Type ct is a dump, in either
// format.
func isDump(ct string) bool {
	got, _, _ := mime.ParseMediaType(ct)
	for _, format := range []string{admin.ContentTypeText, admin.ContentTypeJSONLines} {
		if want, _, _ := mime.ParseMediaType(format); got == want {
			return true
		}
	}
	return false
}

// flushFailed returns the error of a flush's reply, body, that a block did
// not apply everywhere, so that --json fails and stops the stages after it
// as the text does; nil for other replies.
func flushFailed(op string, body []byte) error {
	if !isFlush(op) {
		return nil
	}
	var r admin.FlushReply
	if err := json.Unmarshal(body, &r); err != nil {
		return err
	}
	var failed []string
	for _, b := range r.Blocks {
		if b.Error != "" {
			failed = append(failed, b.Block+": "+printable(b.Error))
		}
	}
	if failed != nil {
		return fmt.Errorf("the flush was applied to these servers' stores, but %s", strings.Join(failed, "; "))
	}
	return nil
}

// isFlush reports whether op replies with an admin.FlushReply.
func isFlush(op string) bool {
	switch op {
	case admin.OpFlush, admin.OpFlushType, admin.OpFlushZone, admin.OpFlushNegative, admin.OpFlushExpired, admin.OpFlushAll:
		return true
	}
	return false
}

// printReply writes a JSON reply as text.
func printReply(op string, body []byte, out io.Writer) error {
	w := bufio.NewWriter(out)
	defer w.Flush()
	dec := json.NewDecoder(bytes.NewReader(body))
	switch {
	case op == admin.OpBlocks:
		var r admin.Blocks
		if err := dec.Decode(&r); err != nil {
			return err
		}
		for _, b := range r.Blocks {
			fmt.Fprintf(w, "%s\tzones=%s\tlisten=%s", b.Name, strings.Join(b.Zones, ","), strings.Join(b.Listen, ","))
			if b.View != "" {
				fmt.Fprintf(w, "\tview=%s", b.View)
			}
			fmt.Fprintln(w)
		}
	case op == admin.OpLookup:
		var r admin.LookupReply
		if err := dec.Decode(&r); err != nil {
			return err
		}
		for _, b := range r.Blocks {
			fmt.Fprintf(w, "; block %s: %d entries\n", b.Block, len(b.Entries))
			for i := range b.Entries {
				w.Write(b.Entries[i].AppendText(nil))
			}
		}
	case op == admin.OpStats:
		var r admin.StatsReply
		if err := dec.Decode(&r); err != nil {
			return err
		}
		for _, s := range r.Blocks {
			printStats(w, &s)
		}
	case isFlush(op):
		var r admin.FlushReply
		if err := dec.Decode(&r); err != nil {
			return err
		}
		for _, b := range r.Blocks {
			n := b.Removed
			status := "ok"
			if b.Error != "" {
				status = "partial" // and flushFailed says why
			}
			fmt.Fprintf(w, "%s %s: removed %d entries (%d success, %d denial, %d ECS lists) in %.3fs\n", status, b.Block, n.Total(), n.Success, n.Denial, n.ECSList, b.Seconds)
		}
	default:
		// An operation this tool cannot print is never read as a flush's reply.
		return fmt.Errorf("no text form for the reply of %q: use --json", op)
	}
	return nil
}

// printStats writes s as unbound-control writes its statistics: a
// name=value line each, the names under the block's.
func printStats(w io.Writer, s *admin.Stats) {
	for _, kv := range []struct {
		name  string
		value any
	}{
		{"entries.success", s.Entries.Success}, {"entries.denial", s.Entries.Denial}, {"entries.ecs_list", s.Entries.ECSList},
		{"bytes.success", s.Bytes.Success}, {"bytes.denial", s.Bytes.Denial}, {"bytes.ecs_list", s.Bytes.ECSList},
		{"entries.nxdomain", s.NXDomain}, {"entries.nodata", s.NoData}, {"entries.servfail", s.ServFail},
		{"entries.expired", s.Expired}, {"entries.stale", s.Stale}, {"entries.ecs_variants", s.ECSVariants},
		{"held_bytes", s.Held}, {"capacity_bytes", s.Capacity},
		{"requests", s.Requests}, {"hits", s.Hits}, {"misses", s.Misses}, {"hit_ratio", fmt.Sprintf("%.4f", s.HitRatio)},
		{"evictions.success", s.Evictions.Success}, {"evictions.denial", s.Evictions.Denial},
	} {
		fmt.Fprintf(w, "%s.%s=%v\n", s.Block, kv.name, kv.value)
	}
}
