package bench

import (
	"errors"
	"net"

	"github.com/miekg/dns"
)

// The addresses of the benchmark's one client: UDP, as most DNS traffic is,
// so that the caches apply their UDP size limits.
var (
	serverAddr = &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}
	clientAddr = &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
)

// Writer is the client's end of a benchmark: a dns.ResponseWriter that does
// with a reply what the server's writer does, packing a message given to
// WriteMsg (Write takes bytes as they are), and keeps the last reply. It
// reuses one buffer; packing still allocates (the compression map), which a
// benchmark measures apart by turning Pack off.
type Writer struct {
	// Pack makes WriteMsg pack the message; off, WriteMsg only keeps it.
	Pack bool

	msg    *dns.Msg
	buf    []byte
	writes int64
}

// NewWriter returns a Writer that packs.
func NewWriter() *Writer { return &Writer{Pack: true, buf: make([]byte, 0, dns.MaxMsgSize)} }

// WriteMsg implements dns.ResponseWriter.
func (w *Writer) WriteMsg(m *dns.Msg) error {
	w.writes++
	w.msg = m
	if !w.Pack {
		return nil
	}
	b, err := m.PackBuffer(w.buf[:cap(w.buf)])
	if err != nil {
		return err
	}
	w.buf = b
	return nil
}

// Write implements dns.ResponseWriter.
func (w *Writer) Write(b []byte) (int, error) {
	w.writes++
	w.msg = nil
	w.buf = append(w.buf[:0], b...)
	return len(b), nil
}

// Writes returns the number of replies written, through WriteMsg or Write.
func (w *Writer) Writes() int64 { return w.writes }

// Reply returns the last reply, unpacking it if it came through Write.
func (w *Writer) Reply() (*dns.Msg, error) {
	if w.writes == 0 {
		return nil, errors.New("no reply written")
	}
	if w.msg != nil {
		return w.msg, nil
	}
	m := new(dns.Msg)
	return m, m.Unpack(w.buf)
}

// LocalAddr implements dns.ResponseWriter.
func (w *Writer) LocalAddr() net.Addr { return serverAddr }

// RemoteAddr implements dns.ResponseWriter.
func (w *Writer) RemoteAddr() net.Addr { return clientAddr }

// Close implements dns.ResponseWriter.
func (w *Writer) Close() error { return nil }

// TsigStatus implements dns.ResponseWriter.
func (w *Writer) TsigStatus() error { return nil }

// TsigTimersOnly implements dns.ResponseWriter.
func (w *Writer) TsigTimersOnly(bool) {}

// Hijack implements dns.ResponseWriter.
func (w *Writer) Hijack() {}
