// Package dnsmsg has the layout of a DNS message's header (RFC 1035 4.1.1),
// which the request readers, the reply writer and the front end read and
// write without unpacking a message.
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
