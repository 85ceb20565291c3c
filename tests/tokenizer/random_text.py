#!/usr/bin/env python3
"""Writes random valid UTF-8 text for the node comparison: words, digits, contractions,
punctuation and whitespace of many scripts, mixed. Only long-assigned code points (no
characters new in Unicode 15, whose properties PCRE2 10.42 does not know yet).
usage: random_text.py SEED BYTES OUT"""
import random
import sys

seed, size, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)
ranges = [(0x20, 0x7E)] * 6 + [(0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
                               (0x900, 0x97F), (0x2000, 0x206F), (0x3000, 0x30FF),
                               (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x1F600, 0x1F64F),
                               (0x1D400, 0x1D4FF)]
ws = [" ", " ", " ", "\t", "\n", "\r\n", "\u00a0", "\u2028", "\u3000", "\u0085", "\ufeff",
      "\u180e", "\u200d", "\u200b", "  ", "   \n"]
snippets = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "don't", "I'm", "123",
            "4.5", "x1", "1x", "!!", "...", "--", "👨\u200d👩\u200d👧", "e\u0301", "\u0301"]
parts, n = [], 0
while n < size:
    r = rng.random()
    if r < 0.25:
        s = rng.choice(ws) * rng.randint(1, 3)
    elif r < 0.4:
        s = rng.choice(snippets)
    else:
        lo, hi = rng.choice(ranges)
        s = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12)))
        s = "".join(c for c in s if not 0xD800 <= ord(c) <= 0xDFFF)
    parts.append(s)
    n += len(s.encode("utf-8"))
with open(out, "w", encoding="utf-8", newline="") as f:
    f.write("".join(parts))
