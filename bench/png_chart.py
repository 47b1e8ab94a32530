"""A small pure-Python PNG bar chart (zlib + struct, no library): panels of
horizontal bars with text labels in a built-in 5x7 bitmap font (upper case,
digits and a little punctuation; other characters print as '?').

  png_chart.write(path, [Panel("TITLE", [("label", value, "value text"), ...]), ...])
"""
import struct
import zlib

# 5x7 glyphs: 7 rows of 5 bits, most significant bit leftmost, as hex pairs.
_FONT = {
    "0": "0e11131519110e", "1": "040c040404040e", "2": "0e11010204081f",
    "3": "1f02040201110e", "4": "02060a121f0202",
    "5": "1f101e0101110e", "6": "0608101e11110e", "7": "1f010204080808",
    "8": "0e11110e11110e", "9": "0e11110f01020c", "A": "0e1111111f1111",
    "B": "1e11111e11111e", "C": "0e11101010110e", "D": "1c12111111121c",
    "E": "1f10101e10101f", "F": "1f10101e101010", "G": "0e11101711110f",
    "H": "1111111f111111", "I": "0e04040404040e", "J": "0702020202120c",
    "K": "11121418141211", "L": "1010101010101f", "M": "111b1515111111",
    "N": "11111915131111", "O": "0e11111111110e", "P": "1e11111e101010",
    "Q": "0e11111115120d", "R": "1e11111e141211", "S": "0f10100e01011e",
    "T": "1f040404040404", "U": "1111111111110e", "V": "11111111110a04",
    "W": "1111111515150a", "X": "11110a040a1111", "Y": "1111110a040404",
    "Z": "1f01020408101f", " ": "00000000000000", ".": "00000000000c0c",
    ",": "000000000c0408", "/": "00010204081000", "-": "0000001f000000",
    "%": "18190204081303", "(": "02040808080402", ")": "08040202020408",
    ":": "000c0c000c0c00", "=": "00001f001f0000", "+": "0004041f040400",
    "_": "0000000000001f", ">": "08040201020408", "<": "02040810080402",
    "#": "0a0a1f0a1f0a0a", "?": "0e110102040004", "[": "0e08080808080e",
    "]": "0e02020202020e", "*": "0004150e150400", "'": "0c040800000000",
    "|": "04040404040404", "$": "040f140e051e04",
}
SCALE = 2  # font pixels per glyph pixel
CHAR_W, CHAR_H = 6 * SCALE, 8 * SCALE  # glyph cell with spacing
PALETTE = [(52, 101, 164), (204, 102, 0), (78, 154, 6), (117, 80, 123), (164, 0, 0),
           (196, 160, 0), (32, 150, 150), (100, 100, 100)]


class Panel:
    """A titled group of bars: rows of (label, value, value text[, colour index])."""

    def __init__(self, title, rows, max_value=None):
        self.title, self.rows = title, rows
        self.max_value = max_value


class Canvas:
    def __init__(self, w, h, bg=(255, 255, 255)):
        self.w, self.h = w, h
        self.px = bytearray(bytes(bg) * (w * h))

    def rect(self, x, y, w, h, colour):
        x0, y0 = max(0, int(x)), max(0, int(y))
        x1, y1 = min(self.w, int(x + w)), min(self.h, int(y + h))
        if x1 <= x0 or y1 <= y0:
            return
        line = bytes(colour) * (x1 - x0)
        for yy in range(y0, y1):
            o = (yy * self.w + x0) * 3
            self.px[o:o + len(line)] = line

    def text(self, x, y, s, colour=(0, 0, 0)):
        for i, ch in enumerate(s.upper()):
            glyph = _FONT.get(ch, _FONT["?"])
            for row in range(7):
                bits = int(glyph[2 * row:2 * row + 2], 16)
                for col in range(5):
                    if bits & (0x10 >> col):
                        self.rect(x + i * CHAR_W + col * SCALE, y + row * SCALE, SCALE, SCALE,
                                  colour)

    def png(self):
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3])
                       for y in range(self.h))

        def chunk(kind, data):
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
        return (b"\x89PNG\r\n\x1a\n"
                + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def render(panels, width=1000, title=None, footer=None):
    """The chart as PNG bytes."""
    bar_h, gap, pad = 22, 6, 14
    label_chars = max([len(r[0]) for p in panels for r in p.rows] + [10])
    label_w = label_chars * CHAR_W + pad
    value_w = max([len(r[2]) for p in panels for r in p.rows] + [6]) * CHAR_W + pad
    height = pad + (CHAR_H + pad if title else 0) + (CHAR_H + pad if footer else 0)
    for p in panels:
        height += CHAR_H + gap + len(p.rows) * (bar_h + gap) + pad
    c = Canvas(width, height)
    y = pad
    if title:
        c.text(pad, y, title)
        y += CHAR_H + pad
    bar_space = width - 2 * pad - label_w - value_w
    for p in panels:
        c.text(pad, y, p.title, (60, 60, 60))
        y += CHAR_H + gap
        top = p.max_value or max([r[1] for r in p.rows] + [1e-9])
        x0 = pad + label_w
        c.rect(x0 - 1, y, 1, len(p.rows) * (bar_h + gap), (150, 150, 150))  # axis
        for i, row in enumerate(p.rows):
            label, value, vtext = row[0], row[1], row[2]
            colour = PALETTE[(row[3] if len(row) > 3 else i) % len(PALETTE)]
            c.text(pad, y + (bar_h - 7 * SCALE) // 2, label)
            w = max(1, int(bar_space * min(value, top) / top)) if value > 0 else 0
            c.rect(x0, y, w, bar_h, colour)
            c.text(x0 + w + 6, y + (bar_h - 7 * SCALE) // 2, vtext)
            y += bar_h + gap
        y += pad
    if footer:
        c.text(pad, y, footer, (90, 90, 90))
    return c.png()


def write(path, panels, **kw):
    with open(path, "wb") as f:
        f.write(render(panels, **kw))
