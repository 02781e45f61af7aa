//go:build !linux

package frontend

import (
	"errors"
	"net"
	"net/netip"
	"runtime"
)

// serveUDP is never called: frontendConfig.check refuses other systems.
func (fe *frontend) serveUDP(*net.UDPConn) {}

// askDestinations is never called for a socket that serves: as serveUDP.
func askDestinations(*net.UDPConn) error { return nil }

// threadSocket and what uses it are never called either: as serveUDP.
type threadSocket struct{ local net.Addr }

func listenThread(string) (*threadSocket, error) { return nil, errors.New("needs Linux") }

func (*threadSocket) shutdown() {}
func (*threadSocket) sendmsg(_, _ []byte, _ netip.AddrPort) (int, error) {
	return 0, errors.ErrUnsupported
}
func (*threadSocket) close()                   {}
func (fe *frontend) serveThread(*threadSocket) {}
func raiseProcs(int)                           {}

func procs() int { return runtime.GOMAXPROCS(0) }

func (fe *frontend) drainUDP(udpSockets)  {}
func queued(net.Listener, int) []net.Conn { return nil }
