// Package dnsmsg is what the request readers, the reply writer and the
// front end know of DNS messages below miekg/dns, to read and write them
// without unpacking one: the header's layout (RFC 1035 4.1.1), names in wire
// form (packing, case, comparing, compressing: RFC 1035 4.1.4, RFC 4343),
// zone sets, the rdata names a writer may compress (RFC 3597 4), TTLs (RFC
// 2181 8) and the client subnet option's addresses (RFC 7871).
package dnsmsg

const HeaderLen = 12

// Offsets in the header.
const (
	OffID      = 0
	OffFlags   = 2
	OffQDCount = 4
	OffANCount = 6
	OffNSCount = 8
	OffARCount = 10
)

// Bits of the header's second 16-bit word (RFC 1035 4.1.1, RFC 4035 3.2).
const (
	QR = 1 << 15
	AA = 1 << 10
	TC = 1 << 9
	RD = 1 << 8
	RA = 1 << 7
	AD = 1 << 5
	CD = 1 << 4

	QROpcode = QR | 0xF<<11 // a response, or an opcode other than QUERY
)

// typicalMsgLen is the size message buffers start at: that of the EDNS
// buffers of DNS flag day 2020. They grow with the rare larger message and
// stay grown where they are pooled; starting at 64 KiB cost every query in
// flight 130 KiB.
const TypicalLen = 1232
