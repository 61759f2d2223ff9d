"""A pure-Python "dependency" for the linescope benchmark: lives outside the profiled root,
so a line tracer must not record it (its time belongs to the calling user line)."""


class _Hasher:
    def __init__(self):
        self.h = 2166136261

    def feed(self, ch):
        self.h = ((self.h ^ ord(ch)) * 16777619) & 0xFFFFFFFF


def tokenize(text):
    out = []
    word = []
    for ch in text:
        if ch == " ":
            if word:
                out.append("".join(word))
                word = []
        else:
            word.append(ch)
    if word:
        out.append("".join(word))
    return out


def checksum(words):
    h = _Hasher()
    for w in words:
        for ch in w:
            h.feed(ch)
    return h.h
