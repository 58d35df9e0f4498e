def pytest_configure(config):
    config.addinivalue_line("markers", "plots: build the dashboard with live plots (slower)")
    config.addinivalue_line("markers", "slow: starts a kernel, a notebook, a server or a browser")
