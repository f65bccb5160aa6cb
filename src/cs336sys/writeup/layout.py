"""The printed page: A4, the body in 10 pt, tables in 9 pt. Figures are made exactly TEXT_WIDTH_CM wide
(`cs336sys.analysis.common`) and set at the text width, so their font sizes are their printed sizes."""

PAPER = "a4"
PAGE_WIDTH_CM = 21.0
MARGIN_X_CM = 2.0
MARGIN_Y_CM = 2.2
TEXT_WIDTH_CM = PAGE_WIDTH_CM - 2 * MARGIN_X_CM
BODY_PT = 10
TABLE_PT = 9
KEEP_TOGETHER_CM = 9  # a table at most this tall is not split across pages
