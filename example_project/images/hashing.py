"""A perceptual hash small enough to read: dHash, 64 bits of "is the next pixel brighter".

Shrinking to 9x8 grey pixels throws away size, compression noise and small edits, so a
resized, recompressed or lightly edited copy keeps almost the same bits, while a different
picture agrees in about half of them.
"""

from PIL import Image as Pillow


def dhash(picture: Pillow.Image) -> str:
    """The picture's difference hash as 16 hex digits."""
    small = picture.convert("L").resize((9, 8), Pillow.Resampling.LANCZOS)
    pixels = small.tobytes()  # 8 rows of 9 grey levels
    bits = 0
    for row in range(8):
        for col in range(8):
            left, right = pixels[row * 9 + col], pixels[row * 9 + col + 1]
            bits = bits << 1 | (left < right)
    return f"{bits:016x}"


def distance(a: str, b: str) -> int:
    """How many of the 64 bits differ."""
    return (int(a, 16) ^ int(b, 16)).bit_count()
