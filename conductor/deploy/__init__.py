"""Deployable programs: save a compiled ``Conductor`` as one folder, load it back, serve it over HTTP.

``save_program`` / ``load_program`` (alias ``load``) need nothing beyond the core package; ``create_app`` needs
FastAPI (``pip install 'dspy-conductor[serve]'``) and imports it only when called.
"""

from conductor.deploy._artifact import FORMAT_VERSION, load_program, save_program
from conductor.deploy._server import create_app

load = load_program

__all__ = ["FORMAT_VERSION", "create_app", "load", "load_program", "save_program"]
