"""The recording and alert rules, shipped as package data of `fleetcanary.rules`. The
generators beside this file stay out of the wheel."""
