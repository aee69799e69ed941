"""The report: its data (``model``, typed JSON shape in ``schema``), one presentation layer (``present``), the
text, Markdown and HTML renderers (``text``, ``markdown``, ``html``; ``formats`` picks one), the ``--baseline`` gate
(``baseline``), the batch index page (``batch_html``) and the escaping of names (``escape``)."""
