"""The shipped prompt files (*.txt) and their schemas (*.schema.json), installed as package data.

A package only so that a built wheel carries them: `debate.data.prompts` finds this folder through
importlib.resources, in a checkout and in an installed wheel alike.
"""
