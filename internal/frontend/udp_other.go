//go:build !linux

package frontend

import "net"

// serveUDP is never called: frontendConfig.check refuses other systems.
func (fe *frontend) serveUDP(*net.UDPConn) {}

// askDestinations is never called for a socket that serves: as serveUDP.
func askDestinations(*net.UDPConn) error { return nil }
