package frontend

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/metrics/vars"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// A hit the front end answers never reaches the prometheus plugin, which in
// plugin mode counts every request in its per-request series (vars.Report).
// requestMetrics counts front-end hits in those series, with the labels
// vars.Report gives the same request, so that dashboards, alerts and
// autoscalers see one stream whichever path a hit took. vars.Report needs a
// request.Request and allocates; here the labels are read off the request
// and the reply, and each series is resolved once per reader of requests.

// metricsZones is what requestMetrics needs of the block's prometheus
// plugin: its server, view and zones (the block's keys), for the zone label.
type metricsZones struct {
	server, view string
	names        []string // as the prometheus plugin has them
	wire         [][]byte // the same, lowercased wire names
	// plugin is the plugin label of every reply: the metrics recorder
	// learns it through plugin.PluginTracker from the writer that
	// plugin.NextOrFailure wraps around it alone, that of the plugin right
	// after prometheus in the chain, whichever plugin wrote the reply.
	plugin string
}

// blockMetrics returns what the front end of the block of cfg needs to
// count hits as the prometheus plugin would, and the plugin label of its
// replies (see metricsZones.plugin), or nil when no prometheus plugin
// stands before the cache, the plugin named cache: then hits do no
// registry work at all.
func blockMetrics(cfg *dnsserver.Config, cache string) (*metrics.Metrics, string) {
	handlers := cfg.Handlers()
	for i, h := range handlers {
		if h.Name() == cache {
			return nil, "" // plugins after the cache never see hits
		}
		if m, ok := h.(*metrics.Metrics); ok && i+1 < len(handlers) {
			return m, handlers[i+1].Name()
		}
	}
	return nil, ""
}

func newMetricsZones(m *metrics.Metrics, plugin, server, view string) *metricsZones {
	z := &metricsZones{server: server, view: view, names: m.ZoneNames(), plugin: plugin}
	for _, n := range z.names {
		b := make([]byte, dnsmsg.MaxNameLen)
		l, err := dns.PackDomainName(dns.Fqdn(strings.ToLower(n)), b, 0, nil, false)
		if err != nil {
			l = 1 // the root, which the plugin would match too
			b[0] = 0
		}
		z.wire = append(z.wire, b[:l])
	}
	return z
}

// zone returns the label the prometheus plugin gives a request for name, a
// wire name: the longest of its zones that holds name, else ".".
func (z *metricsZones) zone(name []byte) string {
	if i := z.zoneIndex(name); i >= 0 {
		return z.names[i]
	}
	return "."
}

// zoneIndex returns the index of the longest of the zones that holds name,
// -1 for none.
func (z *metricsZones) zoneIndex(name []byte) int {
	best := -1
	for off := 0; off < len(name); off += int(name[off]) + 1 {
		for i, w := range z.wire {
			if len(w) == len(name)-off && (best < 0 || len(w) > len(z.wire[best])) && dnsmsg.EqualFoldWire(w, name[off:]) {
				best = i
			}
		}
		if name[off] == 0 {
			break
		}
	}
	return best
}

// requestLabels are the labels of one request in the prometheus plugin's
// per-request series, besides the server's and the view's.
type requestLabels struct {
	zone   string
	proto  string // udp or tcp
	family string // 1 for IPv4, 2 for IPv6
	qtype  string // the type, or "other" for those vars does not monitor
	rcode  string
	do     bool
}

// labelsOf returns the labels vars.Report gives a request of name and qtype
// from client over tcp or UDP, with DO or not, answered with rcode.
func (z *metricsZones) labelsOf(name []byte, qtype uint16, client netip.Addr, tcp, do bool, rcode int) requestLabels {
	l := requestLabels{zone: z.zone(name), proto: "udp", family: "1", qtype: "other", do: do}
	if tcp {
		l.proto = "tcp"
	}
	if family6(client) {
		l.family = "2"
	}
	if monitored(qtype) {
		l.qtype = dns.Type(qtype).String()
	}
	l.rcode = rcodeString(rcode)
	return l
}

// family6 reports whether vars.Report gives client family 2, as
// request.Family does: an address with an IPv4 form is family 1.
func family6(client netip.Addr) bool { return client.Is6() && !client.Is4In6() }

// monitoredTypes are the types vars.Report names in its type label (its
// monitorType); every other type is "other".
var monitoredTypes = map[uint16]struct{}{
	dns.TypeAAAA: {}, dns.TypeA: {}, dns.TypeCNAME: {}, dns.TypeDNSKEY: {}, dns.TypeDS: {},
	dns.TypeMX: {}, dns.TypeNSEC3: {}, dns.TypeNSEC: {}, dns.TypeNS: {}, dns.TypePTR: {},
	dns.TypeRRSIG: {}, dns.TypeSOA: {}, dns.TypeSRV: {}, dns.TypeTXT: {}, dns.TypeHTTPS: {},
	dns.TypeSVCB: {}, dns.TypeIXFR: {}, dns.TypeAXFR: {}, dns.TypeANY: {},
}

// monitoredBits holds monitoredTypes as bits, all below 256: a hit asks
// for one bit, not a map lookup.
var monitoredBits = func() (bits [4]uint64) {
	for t := range monitoredTypes {
		if t >= 256 {
			panic("frontend: monitored type " + dns.Type(t).String() + " is past the bitset")
		}
		bits[t/64] |= 1 << (t % 64)
	}
	return bits
}()

// monitored reports whether vars.Report names qtype in its type label.
func monitored(qtype uint16) bool {
	return qtype < 256 && monitoredBits[qtype/64]&(1<<(qtype%64)) != 0
}

// rcodeString is rcode.ToString, the prometheus plugin's rcode label.
func rcodeString(rcode int) string {
	if s, ok := dns.RcodeToString[rcode]; ok {
		return s
	}
	return "RCODE" + strconv.Itoa(rcode)
}

// series are the metrics of one label set, resolved.
type series struct {
	requests, responses, do prometheus.Counter
	duration                prometheus.Observer
	requestSize             prometheus.Observer
	responseSize            prometheus.Observer
}

func (z *metricsZones) resolve(l requestLabels) *series {
	s := &series{
		requests:     vars.RequestCount.WithLabelValues(z.server, l.zone, z.view, l.proto, l.family, l.qtype),
		responses:    vars.ResponseRcode.WithLabelValues(z.server, l.zone, z.view, l.rcode, z.plugin),
		duration:     vars.RequestDuration.WithLabelValues(z.server, l.zone, z.view),
		requestSize:  vars.RequestSize.WithLabelValues(z.server, l.zone, z.view, l.proto),
		responseSize: vars.ResponseSize.WithLabelValues(z.server, l.zone, z.view, l.proto),
	}
	if l.do {
		s.do = vars.RequestDo.WithLabelValues(z.server, l.zone, z.view)
	}
	return s
}

// requestMetrics counts the hits of one reader of requests (a UDP socket's
// goroutine, a TCP connection's) in the prometheus plugin's series. The
// series it has met are kept in a map of its own, which no other goroutine
// touches, by a key packed from what decides their labels: a hit takes no
// lock, allocates nothing once its series is known, and makes the labels'
// strings only for a series it has not met. Hits come in runs of one
// series, so the last one found is tried first.
type requestMetrics struct {
	z      *metricsZones
	series map[seriesKey]*series
	last   seriesKey
	lastS  *series
}

// seriesKey packs what labelsOf reads of a request: the zone's index (plus
// one, 0 for the root), the type (0 for those labelled "other", so that a
// client asking every type makes no more keys than labels), the rcode and
// the protocol, family and DO flags.
type seriesKey uint64

func keyOf(zone int, qtype uint16, rcode int, tcp, v6, do bool) seriesKey {
	if !monitored(qtype) {
		qtype = 0
	}
	k := seriesKey(zone+1)<<40 | seriesKey(qtype)<<24 | seriesKey(rcode&0xFFFF)<<8
	if tcp {
		k |= 1
	}
	if v6 {
		k |= 2
	}
	if do {
		k |= 4
	}
	return k
}

func (z *metricsZones) reader() *requestMetrics {
	if z == nil {
		return nil
	}
	return &requestMetrics{z: z, series: map[seriesKey]*series{}}
}

// count counts the hit that answered the request of reqLen bytes from
// client with reply, sent took after the request came in.
func (m *requestMetrics) count(reply []byte, reqLen int, client netip.Addr, tcp bool, hit *Hit, took time.Duration) {
	if m == nil {
		return
	}
	end := dnsmsg.NameEnd(reply, dnsmsg.HeaderLen)
	if end < 0 || len(reply) < end+2 {
		return // the reply writer wrote it: it has its question
	}
	name := reply[dnsmsg.HeaderLen:end]
	qtype := binary.BigEndian.Uint16(reply[end:])
	rcode := int(binary.BigEndian.Uint16(reply[dnsmsg.OffFlags:]) & 0xF)
	k := keyOf(m.z.zoneIndex(name), qtype, rcode, tcp, family6(client), hit.DO)
	s := m.lastS
	if s == nil || k != m.last {
		var ok bool
		if s, ok = m.series[k]; !ok {
			s = m.z.resolve(m.z.labelsOf(name, qtype, client, tcp, hit.DO, rcode))
			m.series[k] = s
		}
		m.last, m.lastS = k, s
	}
	if s.do != nil {
		s.do.Inc()
	}
	s.requests.Inc()
	s.duration.Observe(took.Seconds())
	s.responseSize.Observe(float64(len(reply)))
	s.requestSize.Observe(float64(reqLen))
	s.responses.Inc()
}
