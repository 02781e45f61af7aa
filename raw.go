package compactcache

import (
	"context"
	"reflect"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/pkg/nonwriter"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"
)

// rawWriters are the plugins that neither wrap the ResponseWriter to read
// or change replies nor make nested lookups through the chain. In a block of
// these alone, hits can go out as bytes.
var rawWriters = map[string]bool{
	pluginName: true,
	"acl":      true,
	"any":      true,
	"bufsize":  true,
	"cancel":   true,
	"chaos":    true,
	"errors":   true,
	"forward":  true,
	"hosts":    true,
	"local":    true,
	"loop":     true,
	"metadata": true,
	"whoami":   true,
}

func rawSafe(handlers []plugin.Handler) bool {
	for _, h := range handlers {
		if !rawWriters[h.Name()] {
			return false
		}
	}
	return true
}

// nested reports whether w belongs to a nested lookup (autopath, dns64,
// kubernetes ExternalName, file's out-of-zone CNAME targets): such lookups
// run the chain with a nonwriter.Writer, whose Write would go straight to the
// original client. The writer may be wrapped by the server's ScrubWriter and
// by plugin.NextOrFailure's unexported writer, one per plugin before the
// cache; nested sees through both.
func nested(w dns.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case *nonwriter.Writer:
			return true
		case *request.ScrubWriter:
			w = t.ResponseWriter
		default:
			if reflect.TypeOf(w) != pluginWriterType {
				return false
			}
			// The wrapper's only field is the embedded writer.
			w = reflect.ValueOf(w).Elem().Field(0).Interface().(dns.ResponseWriter)
		}
	}
}

// pluginWriterType is the type of the writer plugin.NextOrFailure hands the
// next plugin, learnt from NextOrFailure itself since it is not exported.
var pluginWriterType = func() reflect.Type {
	var t reflect.Type
	plugin.NextOrFailure("", plugin.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, _ *dns.Msg) (int, error) {
		t = reflect.TypeOf(w)
		return 0, nil
	}), context.Background(), noClient{}, nil)
	return t
}()
