"""The ground floor (DESIGN.md, Layout): small dependency-free helpers that several components need
and none owns. Imports nothing of the project."""
