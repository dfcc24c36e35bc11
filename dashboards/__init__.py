"""The Grafana dashboards: generated JSON under json/, shipped as package data of
`fleetcanary.dashboards`. The generators beside this file stay out of the wheel."""
