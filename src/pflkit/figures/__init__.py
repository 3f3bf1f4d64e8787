"""Figure drawing for the plot stages, one module per paper: what the thin plotting notebooks call.

Plot stages (``<stage>_plot``) import these and ``pflkit.plotting`` (the shared style); compute stages
import neither, so a change to how a figure looks re-runs only the plot stages."""
