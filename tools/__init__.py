"""Tools of the repository that do not ship in the wheel: ``supported_models`` writes the documentation's
supported-models page (``make supported-models``), ``readme_figure`` the heatmap at the top of README.md
(``make readme-figure``)."""
