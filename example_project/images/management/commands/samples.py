"""``manage.py samples``: draw the sample pictures and upload them (safe to run again)."""

from pathlib import Path

from django.core.files.base import ContentFile
from django.core.management.base import BaseCommand

from images import samples
from images.uploads import accept


class Command(BaseCommand):
    help = ("Draw sample pictures, with planted near-duplicates and one file that is not an "
            "image, and upload them. Running it again uploads nothing new.")

    def add_arguments(self, parser):
        parser.add_argument("--dir", type=Path,
                            help="Also write the files into this folder, to upload by hand.")

    def handle(self, *args, dir=None, **options):
        files = samples.samples()
        new = 0
        for name, content in files:
            if dir is not None:
                dir.mkdir(parents=True, exist_ok=True)
                (dir / name).write_bytes(content)
            # The key makes the upload idempotent: a second run finds the first one's image.
            _, created = accept(ContentFile(content, name=name), key=f"sample:{name}")
            new += created
        planted = ", ".join(sorted(" ~ ".join(sorted(pair)) for pair in samples.planted_pairs()))
        self.stdout.write(f"Uploaded {new} of {len(files)} sample files "
                          f"({len(files) - new} were there already). Planted duplicates: "
                          f"{planted}.")
