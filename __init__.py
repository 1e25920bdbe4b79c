"""Digital Human Clone: ComfyUI custom-node pack (voice clone + talking head).

ComfyUI imports this file from custom_nodes/<pack>/; pip installs the same tree as
`digital_human`. Everything heavy is imported lazily inside the nodes so that importing the
pack (ComfyUI start-up, `digital-human --help`) stays fast and never fails on a missing
optional dependency.
"""
WEB_DIRECTORY = "./js"

# pytest (9.2+) imports a rootdir's __init__.py as a plain module named "__init__" when it sets up
# the directory as a package; only register nodes when imported as a real package.
if __package__:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
    from .samples import install_into_comfy_input

    install_into_comfy_input()  # the templates' sample inputs (made by `setup`), never over a user's file

    __all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
