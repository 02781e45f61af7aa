package harness

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/miekg/dns"
)

// Server is a DNS server in the tool's process, over UDP and TCP on one
// port of 127.0.0.1: an upstream a run puts behind the server it measures.
type Server struct {
	udp, tcp *dns.Server
}

// Serve starts h on a port of 127.0.0.1 free for UDP and TCP, and returns
// once both listeners serve.
func Serve(h dns.Handler) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		pc.Close()
		return nil, err
	}
	s := &Server{udp: &dns.Server{PacketConn: pc, Handler: h}, tcp: &dns.Server{Listener: l, Handler: h}}
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe()
		<-started
	}
	return s, nil
}

// Addr is where the server listens, HOST:PORT.
func (s *Server) Addr() string { return s.udp.PacketConn.LocalAddr().String() }

// Shutdown stops both listeners.
func (s *Server) Shutdown() {
	s.udp.Shutdown()
	s.tcp.Shutdown()
}

// PortsFree checks that the ports in [from, end) are free for both TCP and
// UDP on 127.0.0.1, before a run starts servers on them.
func PortsFree(from, end int) error {
	for port := from; port < end; port++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("port %d is taken: %v", port, err)
		}
		l.Close()
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			return fmt.Errorf("udp port %d is taken: %v", port, err)
		}
		u.Close()
	}
	return nil
}

// FreePort returns a port of 127.0.0.1 free for TCP and UDP just now, with
// the port after it (PortsFree), for a server the tool starts.
func FreePort() (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if PortsFree(port, port+1) == nil {
			return port, nil
		}
	}
	return 0, errors.New("no port of 127.0.0.1 free for TCP and UDP with the one after it")
}
