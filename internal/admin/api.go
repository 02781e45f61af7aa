// Package admin is what compactcache's admin endpoint and its command-line
// tool (cmd/compactcache-ctl) share: the operations, their HTTP methods and
// parameters, and the JSON documents they answer with.
//
// Every operation is one path, /v1/OP, with its parameters in the query
// string; a request without the parameter block addresses every block of
// the server. Flushes are POST, the rest GET (and HEAD, answered with GET's
// status and headers). Replies are JSON, but for the dump, which streams
// zone-file text or JSON lines (an Entry a line).
// Errors are an Error document with the HTTP status: 400 for a parameter
// that does not parse (Field names it), 401 without the right bearer token,
// 404 for an unknown block or operation, 405 for the wrong method.
package admin

import "net/http"

// Prefix is the path every operation's path starts with.
const Prefix = "/v1/"

// Operations, named as unbound-control names its own where it has one.
const (
	OpFlush         = "flush"          // name: every type and ECS variant of the name
	OpFlushType     = "flush_type"     // name, type
	OpFlushZone     = "flush_zone"     // zone: every name at or below it
	OpFlushNegative = "flush_negative" // NXDOMAIN, NODATA and SERVFAIL entries
	OpFlushExpired  = "flush_expired"  // entries past their TTL, stale ones included
	OpFlushAll      = "flush_all"      // everything
	OpLookup        = "lookup"         // name, optional type
	OpDump          = "dump"           // optional format: text (default) or json
	OpStats         = "stats"
	OpBlocks        = "blocks"
	// OpSnapshot streams one block's store in the snapshot format
	// (internal/snapshot), for a new instance's warm-up (the warmup option).
	OpSnapshot = "snapshot"
)

// Spec says how an operation is asked for.
type Spec struct {
	Method   string
	Flush    bool     // a flush, answered with a FlushReply
	Required []string // parameters it needs, in the order the tool takes them as arguments
	Optional []string // besides block
}

// Specs are the operations.
var Specs = map[string]Spec{
	OpFlush:         {Method: http.MethodPost, Flush: true, Required: []string{"name"}},
	OpFlushType:     {Method: http.MethodPost, Flush: true, Required: []string{"name", "type"}},
	OpFlushZone:     {Method: http.MethodPost, Flush: true, Required: []string{"zone"}},
	OpFlushNegative: {Method: http.MethodPost, Flush: true},
	OpFlushExpired:  {Method: http.MethodPost, Flush: true},
	OpFlushAll:      {Method: http.MethodPost, Flush: true},
	OpLookup:        {Method: http.MethodGet, Required: []string{"name"}, Optional: []string{"type"}},
	OpDump:          {Method: http.MethodGet, Optional: []string{"format"}},
	OpStats:         {Method: http.MethodGet},
	OpBlocks:        {Method: http.MethodGet},
	OpSnapshot:      {Method: http.MethodGet, Required: []string{ParamBlock}},
}

// ParamBlock selects one block by its Name; without it an operation
// addresses every block.
const ParamBlock = "block"

// Dump formats.
const (
	FormatText = "text" // zone-file text, each entry's metadata in a comment
	FormatJSON = "json" // JSON lines, an Entry each
)

// The media types of the dump's formats.
const (
	ContentTypeText      = "text/plain; charset=utf-8"
	ContentTypeJSONLines = "application/x-ndjson"
)

// Error is the body of every reply that is not 200.
type Error struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"` // the parameter at fault, for 400
}

// Block describes one server block's cache.
type Block struct {
	Name   string   `json:"name"`   // its keys, bind addresses and view, as the log names it
	Zones  []string `json:"zones"`  // the zones it caches
	Listen []string `json:"listen"` // the addresses its server listens on
	View   string   `json:"view,omitempty"`
}

// Blocks is the reply to blocks.
type Blocks struct {
	Blocks []Block `json:"blocks"`
}

// Counts are entries (or bytes) by kind.
type Counts struct {
	Success int64 `json:"success"`
	Denial  int64 `json:"denial"`   // NXDOMAIN, NODATA and SERVFAIL
	ECSList int64 `json:"ecs_list"` // the lists of a name's ECS variants
}

// Total is the sum of the kinds.
func (c Counts) Total() int64 { return c.Success + c.Denial + c.ECSList }

// Flushed is what a flush removed from one block.
type Flushed struct {
	Block   string  `json:"block"`
	Removed Counts  `json:"removed"`
	Seconds float64 `json:"seconds"`
	// Error says what the flush did not reach, applied to the block's
	// store all the same: the shared tier and the other replicas.
	Error string `json:"error,omitempty"`
}

// FlushReply is the reply to every flush.
type FlushReply struct {
	Op     string    `json:"op"`
	Blocks []Flushed `json:"blocks"`
}

// Entry is one cached entry, as lookup and the JSON dump give it.
type Entry struct {
	Block string `json:"block,omitempty"` // in the dump
	Name  string `json:"name"`
	Type  string `json:"type"`
	Class string `json:"class"`
	// The key's flags besides the question: CD (checking disabled), and
	// non-answer, the slot that keeps a denial or failure beside an answer
	// under serve_stale_policy prefer_positive. DO is not in the key: one
	// entry serves DO and non-DO clients, unless it is stored without
	// DNSSEC records: for a client without DO, with the DNSSEC records of
	// the reply left out, which a DO client's query then fetches.
	CD        bool `json:"cd"`
	NonAnswer bool `json:"non_answer,omitempty"`
	NoDNSSEC  bool `json:"no_dnssec,omitempty"`
	// ECS: the client subnet the entry is stored for ("" for everyone), and
	// how it matches: "scope" (clients within the subnet), "exact" (clients
	// that send this very prefix) or "source0" (queries with source /0).
	ECS      string   `json:"ecs,omitempty"`
	ECSMatch string   `json:"ecs_match,omitempty"`
	Rcode    string   `json:"rcode"`
	Kind     string   `json:"kind"`     // success or denial
	Stored   int64    `json:"stored"`   // unix seconds
	TTL      int64    `json:"ttl"`      // the TTL it was stored with
	TTLLeft  int64    `json:"ttl_left"` // seconds; 0 or less once expired
	Stale    bool     `json:"stale"`    // expired, and within the serve_stale window
	Expired  bool     `json:"expired"`  // expired, stale or not
	Bytes    int      `json:"bytes"`    // the entry's bytes in the store
	Hits     int      `json:"hits"`     // popularity: hits in the current prefetch window
	Answer   []string `json:"answer,omitempty"`
	Ns       []string `json:"authority,omitempty"`
	Extra    []string `json:"additional,omitempty"`
}

// BlockEntries are the entries lookup found in one block.
type BlockEntries struct {
	Block   string  `json:"block"`
	Entries []Entry `json:"entries"`
}

// LookupReply is the reply to lookup.
type LookupReply struct {
	Blocks []BlockEntries `json:"blocks"`
}

// Stats describes one block's cache.
type Stats struct {
	Block       string `json:"block"`
	Entries     Counts `json:"entries"`
	Bytes       Counts `json:"bytes"` // the entries' own bytes, by kind
	NXDomain    int64  `json:"nxdomain"`
	NoData      int64  `json:"nodata"`
	ServFail    int64  `json:"servfail"`
	Expired     int64  `json:"expired"` // stale ones included
	Stale       int64  `json:"stale"`
	ECSVariants int64  `json:"ecs_variants"`
	Held        int64  `json:"held_bytes"` // all the store holds: arenas, index, bookkeeping
	Capacity    int64  `json:"capacity_bytes"`
	// Since the process started, summed over the block's servers, as the
	// block's Prometheus counters count them.
	Requests  int64   `json:"requests"`
	Hits      int64   `json:"hits"`
	Misses    int64   `json:"misses"`
	HitRatio  float64 `json:"hit_ratio"`
	Evictions Counts  `json:"evictions"`
	Shared    *Shared `json:"shared,omitempty"`
	// Kubernetes is the block's invalidation from the Kubernetes API (the
	// kubernetes option); nil without one.
	Kubernetes *Kubernetes `json:"kubernetes,omitempty"`
}

// StatsReply is the reply to stats.
type StatsReply struct {
	Blocks []Stats `json:"blocks"`
}

// Shared describes a block's shared tier (the shared option), since the
// process started.
type Shared struct {
	URL      string `json:"url"`
	Breaker  string `json:"breaker"` // closed, open or half-open
	Requests int64  `json:"requests"`
	Hits     int64  `json:"hits"`
	Misses   int64  `json:"misses"`
	Errors   int64  `json:"errors"`
	Timeouts int64  `json:"timeouts"`
	Skipped  int64  `json:"skipped"`  // not asked: the breaker was open
	Rejected int64  `json:"rejected"` // values that failed their checks
	Writes   int64  `json:"writes"`
	// Writes not made: the queue was full, the breaker open, or the tier
	// erred.
	WritesDropped   int64 `json:"writes_dropped"`
	FlushesSent     int64 `json:"flushes_sent"`
	FlushesReceived int64 `json:"flushes_received"`
}

// Kubernetes describes a block's invalidation from the Kubernetes API,
// since the block started.
type Kubernetes struct {
	// Source: "kubernetes plugin" (the block's plugin's informers) or
	// "watch" (a watch of its own).
	Source    string `json:"source"`
	Connected bool   `json:"connected"`
	// The cluster's changes that made cached answers wrong, by kind.
	Services   int64 `json:"services"`
	Endpoints  int64 `json:"endpoints"`
	Pods       int64 `json:"pods"`
	Namespaces int64 `json:"namespaces"`
	// Names and subtrees flushed, and the entries those flushes dropped.
	Names    int64  `json:"names"`
	Subtrees int64  `json:"subtrees"`
	Dropped  Counts `json:"dropped"`
	// Disconnects counts the times the connection was lost.
	Disconnects int64 `json:"disconnects"`
	// API is what a watch of its own asked of the API server; nil for the
	// kubernetes plugin's, whose load is the plugin's own.
	API *KubernetesAPI `json:"api,omitempty"`
}

// KubernetesAPI is the requests a watch of its own made to the API server,
// and the bytes of their responses' bodies as the client read them.
type KubernetesAPI struct {
	Lists   int64 `json:"lists"`
	Watches int64 `json:"watches"`
	Other   int64 `json:"other"` // readiness probes
	Bytes   int64 `json:"bytes"`
}
