package tier

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"hash"
	"sync"

	"github.com/compactcache/compactcache/internal/entry"
)

// The tier's keys and values. A value is the packed entry the store and
// snapshots hold, after a tag that authenticates it:
//
//	tag (16)  HMAC-SHA256(secret, "v" key entry), cut to 16 bytes
//	entry     as internal/entry lays it out
//
// where key is the tier key the value is stored under, so that a value
// copied under another key fails. Keys are
//
//	prefix {slot} id
//
// prefix names the settings and the secret (an HMAC of the fingerprint),
// so that blocks of other settings, or of another entry format, never read
// each other's values; slot hashes the question's name and type, so that
// every variant of a question lands on one Redis Cluster slot and one
// lookup reads them in a single round trip; id hashes the whole cache key.
// Without a secret the hashes are plain SHA-256: a value then carries only a
// checksum against damage, and anyone who can write to Redis can forge
// answers (the log says so at startup).

const (
	tagLen  = 16
	slotLen = 6  // bytes of the slot hash: only spreads slots
	idLen   = 16 // bytes of the key hash: collisions would be wrong answers
)

var b64 = base64.RawURLEncoding

// keyer makes the tier's keys and tags from the secret and fingerprint.
type keyer struct {
	secret                 []byte
	prefix                 string
	hashers                *sync.Pool // of *hasher: keying an HMAC allocates, and a lookup makes several
	all, negative, expired string     // the global epochs' keys, which every lookup reads
}

// hasher is a keyed hash and where its sums go, which a call to an
// interface's method would otherwise allocate.
type hasher struct {
	h   hash.Hash
	sum [sha256.Size]byte
}

// The domain separators of the MACs, so that no two uses share an input.
var (
	forPrefix = []byte("p")
	forSlot   = []byte("s")
	forKey    = []byte("k")
	forValue  = []byte("v")
	forFlush  = []byte("f")
)

// epochScope is what an epoch key holds the time of the last flush of.
type epochScope int

const (
	epochAll epochScope = iota
	epochNegative
	epochName
	epochZone
	epochExpired
)

var (
	epochNames = [...]string{epochAll: "all", epochNegative: "negative", epochName: "name", epochZone: "zone", epochExpired: "expired"}
	forEpoch   = [...][]byte{epochAll: []byte("eall"), epochNegative: []byte("enegative"), epochName: []byte("ename"), epochZone: []byte("ezone"), epochExpired: []byte("eexpired")}
)

func newKeyer(secret []byte, fingerprint [32]byte) keyer {
	k := keyer{secret: secret, hashers: &sync.Pool{New: func() any {
		if secret != nil {
			return &hasher{h: hmac.New(sha256.New, secret)}
		}
		return &hasher{h: sha256.New()}
	}}}
	sum := k.mac(forPrefix, fingerprint[:])
	k.prefix = "cc:" + b64.EncodeToString(sum[:9]) + ":"
	k.all, k.negative, k.expired = k.epochKey(epochAll, nil), k.epochKey(epochNegative, nil), k.epochKey(epochExpired, nil)
	return k
}

// mac is HMAC-SHA256 of the parts under the secret, or SHA-256 without
// one; what is the use's domain separator.
func (k keyer) mac(what []byte, parts ...[]byte) [sha256.Size]byte {
	hs := k.hashers.Get().(*hasher)
	hs.h.Reset()
	hs.h.Write(what)
	for _, p := range parts {
		hs.h.Write(p)
	}
	sum := [sha256.Size]byte(hs.h.Sum(hs.sum[:0]))
	k.hashers.Put(hs)
	return sum
}

// maxKeyLen bounds the tier's keys, which are built on the stack.
const maxKeyLen = 64

// key returns the tier key of a cache key.
func (k keyer) key(cacheKey []byte) string {
	slot := k.mac(forSlot, cacheKey[:entry.FlagsAt(cacheKey)])
	id := k.mac(forKey, cacheKey)
	var buf [maxKeyLen]byte
	b := append(append(buf[:0], k.prefix...), '{')
	b = append(b64.AppendEncode(b, slot[:slotLen]), '}')
	return string(b64.AppendEncode(b, id[:idLen]))
}

// epochKey returns the key of the time of the last flush of a name or
// zone (lowercased wire form), or of a scope flushed whole (name nil).
func (k keyer) epochKey(scope epochScope, name []byte) string {
	sum := k.mac(forEpoch[scope], name)
	var buf [maxKeyLen]byte
	b := append(append(append(append(buf[:0], k.prefix...), "e:"...), epochNames[scope]...), ':')
	return string(b64.AppendEncode(b, sum[:idLen]))
}

// witness adds to keys the epochs that a value of name (lowercased wire
// form), stored at stored, is read with: the name's, each zone's above
// it, and the globals. Each maps to the earliest time of the values that
// need it, less one second.
func (k keyer) witness(keys map[string]int64, name []byte, at int64) {
	add := func(key string) {
		if old, ok := keys[key]; !ok || at < old {
			keys[key] = at
		}
	}
	k.epochs(name, add)
}

// epochs calls f with the key of each epoch a lookup of name (lowercased
// wire form) reads, in this order: the flushes of all, of negative
// entries, of expired ones, of the name, and of each zone from the name
// up to the root.
func (k keyer) epochs(name []byte, f func(key string)) {
	f(k.all)
	f(k.negative)
	f(k.expired)
	f(k.epochKey(epochName, name))
	for off := 0; ; off += int(name[off]) + 1 {
		f(k.epochKey(epochZone, name[off:]))
		if name[off] == 0 {
			return
		}
	}
}

// streamKey is the key of the stream of flushes the replicas share.
func (k keyer) streamKey() string { return k.prefix + "flushes" }

// seal returns the value of e under the tier key.
func (k keyer) seal(key string, e entry.Entry) []byte {
	tag := k.mac(forValue, []byte(key), e)
	v := make([]byte, 0, tagLen+len(e))
	return append(append(v, tag[:tagLen]...), e...)
}

// Why a value was refused, the label of its count.
var (
	errShort  = errors.New("short")
	errTag    = errors.New("tag")
	errFormat = errors.New("format")
	errKey    = errors.New("key")
	errEpoch  = errors.New("epoch")
	// errEvicted refuses a value read without all its epochs.
	errEvicted = errors.New("evicted")
)

// open checks v, the value read under key for cacheKey, as untrusted
// input, and returns its entry: the tag, the entry's layout (entry.Check,
// as a snapshot's), and that it is the entry of cacheKey.
func (k keyer) open(key string, cacheKey, v []byte) (entry.Entry, error) {
	if len(v) <= tagLen {
		return nil, errShort
	}
	e := entry.Entry(v[tagLen:])
	want := k.mac(forValue, []byte(key), e)
	if subtle.ConstantTimeCompare(v[:tagLen], want[:tagLen]) != 1 {
		return nil, errTag
	}
	if err := entry.Check(e); err != nil || e.Flags()&entry.FlagMeta != 0 {
		return nil, errFormat
	}
	if string(e.Key()) != string(cacheKey) {
		return nil, errKey
	}
	return e, nil
}
