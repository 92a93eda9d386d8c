"""``manage.py demo_admin``: a superuser "admin" with a new random password, printed."""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create or update the superuser 'admin' with a new random password; print it."

    def handle(self, *args, **options):
        password = secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(username="admin")
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(password)
