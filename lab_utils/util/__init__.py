"""Small helpers every package uses: atomic file writes (`atomic`), a thread beside a
`with` block (`background`), progress bars that work in a terminal, in Jupyter and
when the notebooks run headless (`progress`), and a Ctrl-C that is never lost
(`interrupts`)."""
