"""Development and release tools. The extensionless files are the entry points; the .py modules run as
`python -m scripts.NAME` from the repository root. Not part of the wheel."""
