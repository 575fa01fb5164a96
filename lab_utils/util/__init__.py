"""Small helpers every package uses: atomic file writes (`atomic`), a thread beside a
`with` block (`background`), and progress bars that work in a terminal, in Jupyter and
when the notebooks run headless (`progress`)."""
