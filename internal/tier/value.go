package tier

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"hash"

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
// so that blocks of other settings never read each other's values; slot
// hashes the question without its ECS suffix, so that every variant of a
// question lands on one Redis Cluster slot and one lookup reads them in a
// single round trip; id hashes the whole cache key. Without a secret the
// hashes are plain SHA-256: a value then carries only a checksum against
// damage, and anyone who can write to Redis can forge answers (the log
// says so at startup).

const (
	tagLen  = 16
	slotLen = 6  // bytes of the slot hash: only spreads slots
	idLen   = 16 // bytes of the key hash: collisions would be wrong answers
)

var b64 = base64.RawURLEncoding

// keyer makes the tier's keys and tags from the secret and fingerprint.
type keyer struct {
	secret []byte
	prefix string
}

func newKeyer(secret []byte, fingerprint [32]byte) keyer {
	k := keyer{secret: secret}
	sum := k.mac("p", fingerprint[:])
	k.prefix = "cc:" + b64.EncodeToString(sum[:9]) + ":"
	return k
}

// mac is HMAC-SHA256 of the parts under the secret, or SHA-256 without
// one; what is a domain separator, so that no two uses share an input.
func (k keyer) mac(what string, parts ...[]byte) [sha256.Size]byte {
	var h hash.Hash
	if k.secret != nil {
		h = hmac.New(sha256.New, k.secret)
	} else {
		h = sha256.New()
	}
	h.Write([]byte(what))
	for _, p := range parts {
		h.Write(p)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// key returns the tier key of a cache key.
func (k keyer) key(cacheKey []byte) string {
	slot := k.mac("s", cacheKey[:entry.FlagsAt(cacheKey)])
	id := k.mac("k", cacheKey)
	return k.prefix + "{" + b64.EncodeToString(slot[:slotLen]) + "}" + b64.EncodeToString(id[:idLen])
}

// epochKey returns the key of the time of the last flush of a name or
// zone (lowercased wire form), or of a scope flushed whole ("all",
// "negative").
func (k keyer) epochKey(what string, name []byte) string {
	sum := k.mac("e"+what, name)
	return k.prefix + "e:" + what + ":" + b64.EncodeToString(sum[:idLen])
}

// streamKey is the key of the stream of flushes the replicas share.
func (k keyer) streamKey() string { return k.prefix + "flushes" }

// seal returns the value of e under the tier key.
func (k keyer) seal(key string, e entry.Entry) []byte {
	tag := k.mac("v", []byte(key), e)
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
)

// open checks v, the value read under key for cacheKey, as untrusted
// input, and returns its entry: the tag, the entry's layout (entry.Check,
// as a snapshot's), and that it is the entry of cacheKey.
func (k keyer) open(key string, cacheKey, v []byte) (entry.Entry, error) {
	if len(v) <= tagLen {
		return nil, errShort
	}
	e := entry.Entry(v[tagLen:])
	want := k.mac("v", []byte(key), e)
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
