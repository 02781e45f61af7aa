package dnsmsg

import "encoding/binary"

const (
	// Compression pointers reach the first 16 KiB of a message.
	maxPointer = 0x3FFF
	// maxNames bounds the names a Compressor remembers; a name past it is
	// written whole, which is correct, only longer.
	maxNames = 64
)

// Compressor writes the names of one message, replacing the longest
// suffix of each already in the message by a pointer (RFC 1035 4.1.4). It
// holds no pointer, so that a writer keeps it in pooled memory rather than
// on a goroutine's stack; the message goes in and out of its methods by
// value: appends stored through a pointer pay a write barrier while the
// garbage collector marks, and a reply makes dozens of them.
type Compressor struct {
	names     [maxNames]uint16 // offsets of names and their suffixes
	nnames    int
	qnameSeen bool // the question's labels are in names
}

// Reset readies c for a new message, whose question's name starts at
// HeaderLen.
func (c *Compressor) Reset() { c.nnames, c.qnameSeen = 0, false }

// AppendName writes the uncompressed wire name n, replacing its longest
// suffix already in the message by a pointer.
func (c *Compressor) AppendName(msg, n []byte) []byte {
	if !c.qnameSeen {
		c.qnameSeen = true
		c.remember(HeaderLen, msg[HeaderLen:])
	}
	start := len(msg)
	for i := 0; n[i] != 0; i += int(n[i]) + 1 {
		if p, ok := c.pointerTo(msg, n[i:]); ok {
			msg = append(msg, n[:i]...)
			msg = append(msg, 0xC0|byte(p>>8), byte(p))
			c.remember(start, n[:i+1])
			return msg
		}
	}
	msg = append(msg, n...)
	c.remember(start, n)
	return msg
}

// remember adds the offsets of each label of the name written at start.
// labels is the name as written; only its length bytes are read, up to the
// root label or the end of labels.
func (c *Compressor) remember(start int, labels []byte) {
	for i := 0; i < len(labels) && labels[i] != 0 && labels[i]&0xC0 == 0; i += int(labels[i]) + 1 {
		if start+i > maxPointer || c.nnames == maxNames {
			return
		}
		c.names[c.nnames] = uint16(start + i)
		c.nnames++
	}
}

// pointerTo returns the offset of a name in msg equal to suffix.
func (c *Compressor) pointerTo(msg, suffix []byte) (int, bool) {
	for _, o := range c.names[:c.nnames] {
		if nameAtEqual(msg, int(o), suffix) {
			return int(o), true
		}
	}
	return 0, false
}

// nameAtEqual reports whether the name at off in msg, which may end in a
// pointer, equals the uncompressed name n, case included: a pointer to a
// name in another case, the client's question's say, would change the case
// of the name it replaces (RFC 4343 4.1). The writer only writes pointers
// backwards, so following them terminates.
func nameAtEqual(msg []byte, off int, n []byte) bool {
	i := 0
	for {
		for msg[off]&0xC0 == 0xC0 {
			off = int(binary.BigEndian.Uint16(msg[off:]) & maxPointer)
		}
		l := int(msg[off])
		if l != int(n[i]) {
			return false
		}
		if l == 0 {
			return true
		}
		if string(msg[off+1:off+1+l]) != string(n[i+1:i+1+l]) {
			return false
		}
		off += l + 1
		i += l + 1
	}
}
