"""placeholder, replaced below"""
def configure(c, **kw):
    raise NotImplementedError
