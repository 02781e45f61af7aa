//go:build !linux

package compactcache

import "net"

// serveUDP is never called: frontendConfig.check refuses other systems.
func (fe *frontend) serveUDP(*net.UDPConn) {}
