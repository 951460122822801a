"""The Models panel's style sheet."""

STYLE = """
#recommendBanner { background: #eef3fc; border: 1px solid #b6ccf5; border-radius: 10px; }
#recommendTitle { color: #0b2e6f; font-size: 14px; }
#recommendText { color: #24292f; }
#primaryButton { background: #2f6fde; color: white; border: none; border-radius: 6px; padding: 6px 14px;
                 font-weight: 600; }
#primaryButton:hover { background: #2a63c7; }
#primaryButton:disabled { background: #b8c7e6; }
#pairDetails { background: #fafbfc; border: 1px solid #e1e4e8; border-radius: 8px; }
#detailTitle { font-size: 14px; font-weight: 600; color: #24292f; }
#detailKey { color: #57606a; }
#machineLine, #panelMessage { color: #57606a; }
#panelMessage[level="error"] { color: #a40e26; }
#panelMessage[level="ok"] { color: #116329; }
QTableView { border: 1px solid #e1e4e8; border-radius: 6px; gridline-color: #f0f1f3;
             selection-background-color: #dfe7f7; selection-color: #0b2e6f; }
QTableView::item { padding: 2px 6px; }
QHeaderView::section { background: #f6f8fa; border: none; border-bottom: 1px solid #e1e4e8;
                       padding: 5px 6px; color: #57606a; font-weight: 600; }
"""
