"""What a person looks at: the status document, the status page (HTML and inline SVG) and ``tpuwatch top``.

``document.build_status`` is one pure function from a small set of read-only
readers (``readers.StatusReaders``) to a plain dict; ``render`` turns that dict
into the page, ``page.StatusPage`` serves the page and its JSON at most once
per sampling cycle, and ``top`` draws the same dict in a terminal.  Nothing
here writes to the pipeline it reads.  ``top`` is imported only when chosen.
"""
