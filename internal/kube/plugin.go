package kube

import (
	"net"
	"reflect"

	"github.com/coredns/coredns/plugin/kubernetes"
	"github.com/coredns/coredns/plugin/kubernetes/object"
	"k8s.io/client-go/rest"
)

// controller is what invalidation reads of the kubernetes plugin's
// controller (Kubernetes.APIConn): its informers' stores, and the time of
// their last change that the plugin's answers show.
type controller interface {
	HasSynced() bool
	// Modified is the time, in whole seconds, of the last change of a
	// Service, an EndpointSlice or (pods verified) a Pod that the
	// plugin's answers show; the informers set it after their store.
	Modified(kubernetes.ModifiedMode) int64
	ServiceList() []*object.Service
	EndpointsList() []*object.Endpoints
	GetNamespaceByName(string) (*object.Namespace, error)
}

// Pod modes of the kubernetes plugin's pods option.
const (
	podsDisabled = "disabled"
	podsInsecure = "insecure"
	podsVerified = "verified"
)

// pluginOptions are the kubernetes plugin's options that decide which
// names answer. The plugin keeps them unexported; they are read with
// reflect, read only, from the plugin of the version go.mod pins
// (TestPluginOptions), and a field not found is taken at the setting
// that flushes more.
type pluginOptions struct {
	podMode     string
	podNames    bool // endpoint_pod_names
	ignoreEmpty bool // ignore empty_service
	zonal       bool
	// servers are the nameserver's addresses (localIPs), nil if not
	// found or not set yet: any address may be one. The plugin sets them
	// at its startup, which runs after compactcache's, where Start reads
	// them: compactcache comes first in the directive order.
	servers map[string]struct{}
	missing []string // the fields not found
}

func optionsOf(k *kubernetes.Kubernetes) pluginOptions {
	o := pluginOptions{podMode: podsVerified, ignoreEmpty: true, zonal: true}
	read := func(v reflect.Value, name string, kind reflect.Kind) (reflect.Value, bool) {
		f := v.FieldByName(name)
		if !f.IsValid() || f.Kind() != kind {
			o.missing = append(o.missing, name)
			return f, false
		}
		return f, true
	}
	v := reflect.ValueOf(k).Elem()
	if f, ok := read(v, "podMode", reflect.String); ok {
		o.podMode = f.String()
	}
	if f, ok := read(v, "endpointNameMode", reflect.Bool); ok {
		o.podNames = f.Bool()
	}
	if f, ok := read(v, "localIPs", reflect.Slice); ok && f.Type() != reflect.TypeFor[[]net.IP]() {
		o.missing = append(o.missing, "localIPs")
	} else if ok && f.Len() > 0 {
		o.servers = map[string]struct{}{}
		for i := range f.Len() {
			// As nsAddrs looks them up in the EndpointSlices' addresses.
			o.servers[net.IP(f.Index(i).Bytes()).String()] = struct{}{}
		}
	}
	if opts, ok := read(v, "opts", reflect.Struct); ok {
		if f, ok := read(opts, "ignoreEmptyService", reflect.Bool); ok {
			o.ignoreEmpty = f.Bool()
		}
		if f, ok := read(opts, "zonal", reflect.Bool); ok {
			o.zonal = f.Bool()
		}
	}
	return o
}

// pluginConn is how the plugin reaches the API server, as its own
// getClientConfig makes it: for the health probe, which goes where its
// informers go.
func pluginConn(k *kubernetes.Kubernetes) (*rest.Config, error) {
	if k.ClientConfig != nil {
		cfg, err := k.ClientConfig.ClientConfig()
		if err != nil {
			return nil, err
		}
		cfg.UserAgent = "compactcache"
		return cfg, nil
	}
	c := conn{tlsCA: k.APICertAuth, tlsCert: k.APIClientCert, tlsKey: k.APIClientKey}
	if len(k.APIServerList) > 0 {
		c.endpoint = k.APIServerList[0]
	}
	return c.restConfig()
}
