"""Writing the report: page layout (`layout`), numbered captions and cross-references (`markup`), the
Markdown -> Typst -> PDF conversion (`typst`) and the checks a rendered report must pass (`lint`)."""
