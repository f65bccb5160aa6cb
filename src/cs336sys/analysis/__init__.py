"""Aggregation: result files -> one section directory (tables as CSV + Markdown, PNG figures,
and context.json holding every number the report's prose uses). One module per report section."""
