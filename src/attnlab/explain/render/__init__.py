"""Drawing, apart from what is explained: matplotlib heatmaps and the self-contained HTML writer."""
