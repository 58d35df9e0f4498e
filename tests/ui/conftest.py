def pytest_configure(config):
    config.addinivalue_line("markers", "plots: build the dashboard with live plots (slower)")
