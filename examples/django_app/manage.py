#!/usr/bin/env python
"""The Django example's manage.py: ``python examples/django_app/manage.py runserver --noreload``."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gilsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
