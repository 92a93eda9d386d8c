"""Sample pictures drawn here (no downloads), with planted near-duplicates.

Every picture is a random gradient with random shapes on it; a planted duplicate is one of
them resized, recompressed, brightened or cropped, as people's copies of a photo are.
"""

import io
import random

from PIL import Image as Pillow
from PIL import ImageDraw, ImageEnhance

ORIGINALS = 36
#: (original number, what was done to the copy): the pairs compare_images must find.
PLANTED = [(3, "smaller"), (11, "brighter"), (20, "cropped"), (29, "recompressed")]
NOT_AN_IMAGE = "notes.txt"  # uploaded too: prepare_image fails on it, readably


def original_name(number: int) -> str:
    return f"picture-{number:02d}.png"


def copy_name(number: int, kind: str) -> str:
    return f"picture-{number:02d}-{kind}.jpg"


def planted_pairs() -> set[frozenset[str]]:
    return {frozenset({original_name(n), copy_name(n, kind)}) for n, kind in PLANTED}


def draw(number: int) -> Pillow.Image:
    rng = random.Random(number)
    width, height = 480, 360
    start, end = ([rng.randrange(256) for _ in range(3)] for _ in range(2))
    picture = Pillow.linear_gradient("L").rotate(rng.randrange(360)).resize((width, height))
    channels = [picture.point(lambda v, a=a, b=b: a + (b - a) * v // 255)
                for a, b in zip(start, end, strict=True)]
    picture = Pillow.merge("RGB", channels)
    pen = ImageDraw.Draw(picture)
    for _ in range(rng.randint(10, 16)):
        x, y = rng.randrange(width), rng.randrange(height)
        w, h = rng.randint(30, 200), rng.randint(30, 160)
        color = tuple(rng.randrange(256) for _ in range(3))
        shape = rng.choice([pen.ellipse, pen.rectangle])
        shape([x - w // 2, y - h // 2, x + w // 2, y + h // 2], fill=color)
    return picture


def altered(picture: Pillow.Image, kind: str) -> Pillow.Image:
    width, height = picture.size
    if kind == "smaller":
        return picture.resize((width * 3 // 5, height * 3 // 5))
    if kind == "brighter":
        return ImageEnhance.Brightness(picture).enhance(1.25)
    if kind == "cropped":
        return picture.crop((width // 30, height // 30, width - width // 30, height))
    return picture  # "recompressed": only the JPEG quality below changes it


def encode(picture: Pillow.Image, format: str, quality: int = 90) -> bytes:
    out = io.BytesIO()
    picture.save(out, format=format, quality=quality)
    return out.getvalue()


def samples() -> list[tuple[str, bytes]]:
    """(file name, content) of every sample, in a fixed shuffled upload order."""
    files = [(original_name(n), encode(draw(n), "PNG")) for n in range(1, ORIGINALS + 1)]
    for number, kind in PLANTED:
        quality = 35 if kind == "recompressed" else 85
        files.append((copy_name(number, kind), encode(altered(draw(number), kind), "JPEG",
                                                      quality)))
    files.append((NOT_AN_IMAGE, b"Shopping list: milk, bread, a better camera.\n"))
    random.Random(2024).shuffle(files)
    return files
