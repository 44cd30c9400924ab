package binlog

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/charmap"
	"golang.org/x/text/encoding/japanese"
	"golang.org/x/text/encoding/korean"
	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/encoding/traditionalchinese"
	"golang.org/x/text/encoding/unicode"
	"golang.org/x/text/encoding/unicode/utf32"
)

// Charset handling: text columns are decoded to UTF-8 by their charset.

// isBinaryCharset reports whether a column charset means raw bytes.
func isBinaryCharset(cs string) bool { return cs == "" || cs == "binary" }

// stringLength is the declared byte length of a CHAR/BINARY column, from the
// table map's metadata (the same arithmetic as go-mysql's).
func (c *Column) stringLength() int {
	m := c.Meta
	if m < 256 {
		return int(m)
	}
	b0, b1 := uint8(m>>8), uint8(m&0xFF)
	if b0&0x30 != 0x30 {
		return int(uint16(b1) | uint16((b0&0x30)^0x30)<<4)
	}
	return int(b1)
}

// decodeText converts a character column's bytes to a new UTF-8 string,
// cut from a (which may be nil) when it is a copy.
func decodeText(raw string, charset string, a *rowBytes) (any, error) {
	switch charset {
	case "utf8mb4", "utf8mb3", "utf8", "ascii":
		if !utf8.ValidString(raw) {
			return nil, fmt.Errorf("%s text is not valid UTF-8", charset)
		}
		return a.str(raw), nil
	case "latin1":
		if isASCII(raw) {
			return a.str(raw), nil
		}
		return decodeLatin1(raw), nil
	}
	enc := textEncodings[charset]
	if enc == nil {
		return nil, fmt.Errorf("character set %q is not supported", charset)
	}
	if isASCII(raw) && !asciiIncompatible[charset] {
		return a.str(raw), nil
	}
	out, err := enc.NewDecoder().String(raw)
	if err != nil {
		return nil, fmt.Errorf("decode %s text: %w", charset, err)
	}
	// x/text decoders turn undecodable bytes into U+FFFD; that would be a
	// silent loss, so it is an error unless the input could mean it.
	if strings.ContainsRune(out, utf8.RuneError) && !encodesReplacementChar[charset] {
		return nil, fmt.Errorf("%s text has bytes that do not decode", charset)
	}
	return out, nil
}

func isASCII(b string) bool {
	for i := 0; i < len(b); i++ {
		if b[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// latin1High maps bytes 0x80..0x9F of MySQL's latin1, which is Windows-1252
// except that the five bytes cp1252 leaves undefined (0x81, 0x8D, 0x8F,
// 0x90, 0x9D) map to the C1 controls of the same value, so every byte
// decodes. 0xA0..0xFF are ISO 8859-1, i.e. the code point of the same value.
var latin1High = [32]rune{
	0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021,
	0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x008D, 0x017D, 0x008F,
	0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
	0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x009D, 0x017E, 0x0178,
}

func decodeLatin1(raw string) string {
	if isASCII(raw) {
		return strings.Clone(raw)
	}
	out := make([]byte, 0, len(raw)+len(raw)/2)
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c < 0x80:
			out = append(out, c)
		case c < 0xA0:
			out = utf8.AppendRune(out, latin1High[c-0x80])
		default:
			out = utf8.AppendRune(out, rune(c))
		}
	}
	return string(out)
}

// textEncodings maps MySQL/MariaDB character set names to decoders.
var textEncodings = map[string]encoding.Encoding{
	"latin2":   charmap.ISO8859_2,
	"latin5":   charmap.ISO8859_9,
	"latin7":   charmap.ISO8859_13,
	"greek":    charmap.ISO8859_7,
	"hebrew":   charmap.ISO8859_8,
	"cp1250":   charmap.Windows1250,
	"cp1251":   charmap.Windows1251,
	"cp1256":   charmap.Windows1256,
	"cp1257":   charmap.Windows1257,
	"cp850":    charmap.CodePage850,
	"cp852":    charmap.CodePage852,
	"cp866":    charmap.CodePage866,
	"koi8r":    charmap.KOI8R,
	"koi8u":    charmap.KOI8U,
	"macroman": charmap.Macintosh,
	"tis620":   charmap.Windows874,
	"gbk":      simplifiedchinese.GBK,
	"gb2312":   simplifiedchinese.GBK, // EUC-CN is a subset of GBK
	"gb18030":  simplifiedchinese.GB18030,
	"big5":     traditionalchinese.Big5,
	"sjis":     japanese.ShiftJIS,
	"cp932":    japanese.ShiftJIS,
	"ujis":     japanese.EUCJP,
	"eucjpms":  japanese.EUCJP,
	"euckr":    korean.EUCKR,
	"ucs2":     unicode.UTF16(unicode.BigEndian, unicode.IgnoreBOM),
	"utf16":    unicode.UTF16(unicode.BigEndian, unicode.IgnoreBOM),
	"utf16le":  unicode.UTF16(unicode.LittleEndian, unicode.IgnoreBOM),
	"utf32":    utf32.UTF32(utf32.BigEndian, utf32.IgnoreBOM),
}

// asciiIncompatible charsets do not encode ASCII as itself.
var asciiIncompatible = map[string]bool{"ucs2": true, "utf16": true, "utf16le": true, "utf32": true}

// encodesReplacementChar charsets can legitimately contain U+FFFD.
var encodesReplacementChar = map[string]bool{"ucs2": true, "utf16": true, "utf16le": true, "utf32": true, "gb18030": true}
