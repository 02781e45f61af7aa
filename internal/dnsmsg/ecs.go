package dnsmsg

import (
	"net"
	"net/netip"

	"github.com/miekg/dns"
)

// RemoteIP returns the client's address, invalid when it has none.
func RemoteIP(w dns.ResponseWriter) netip.Addr {
	var ip net.IP
	switch a := w.RemoteAddr().(type) {
	case *net.UDPAddr:
		ip = a.IP
	case *net.TCPAddr:
		ip = a.IP
	}
	addr, _ := netip.AddrFromSlice(ip)
	return addr
}

// SetSubnet replaces any ECS option of o by e, or removes it when e is nil.
func SetSubnet(o *dns.OPT, e *dns.EDNS0_SUBNET) {
	opts := make([]dns.EDNS0, 0, len(o.Option)+1)
	for _, opt := range o.Option {
		if _, ok := opt.(*dns.EDNS0_SUBNET); !ok {
			opts = append(opts, opt)
		}
	}
	if e != nil {
		opts = append(opts, e)
	}
	o.Option = opts
}

// Subnet returns the ECS option (RFC 7871) of m, or nil.
func Subnet(m *dns.Msg) *dns.EDNS0_SUBNET {
	if o := m.IsEdns0(); o != nil {
		for _, opt := range o.Option {
			if e, ok := opt.(*dns.EDNS0_SUBNET); ok {
				return e
			}
		}
	}
	return nil
}
